# The two commands of the README: `make book` and `make test`. Each creates the pinned
# environment in .venv first when it is missing or older than the lock file.
# `make chapters` regenerates chapters/ (the student notebooks) from solutions/, and zh/ (the
# Chinese course) from them and translations/zh/.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST := $(BIN)/python -m pytest
# The site serves MathJax, RequireJS and the widget manager itself; book/package-lock.json pins them.
JS_STAMP := book/node_modules/.installed
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: env js chapters gradebook book test test-fast course-model release clean

env: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

js: $(JS_STAMP)

$(JS_STAMP): book/package.json book/package-lock.json
	npm ci --prefix book --no-audit --no-fund --ignore-scripts
	touch $(JS_STAMP)

chapters: $(STAMP)
	$(BIN)/python scripts/make_chapters.py $(if $(CHAPTER),--chapter $(CHAPTER))

# The course model (tfm_solution/assets/course_model/): retrain it from scratch on the CPU with one
# seeded command (Multi30k from $$MULTI30K_DIR or downloaded), export it and rewrite its model card.
course-model: $(STAMP)
	rm -rf runs/course
	$(BIN)/python -m tfm_solution train --task multi30k --config course --device cpu --seed 0 --out runs/course
	$(BIN)/python scripts/course_model.py runs/course

# Instructors: record every chapter's tests in gradebook.db before `nbgrader autograde`. The
# release goes to a scratch folder: chapters/ stays as committed (with its figures and widgets).
gradebook: $(STAMP)
	for chapter in $$(ls solutions); do \
	  $(BIN)/nbgrader generate_assignment $$chapter --force --CourseDirectory.release_directory=_build/nbgrader-release || exit 1; \
	done

# Instructors: the graded release of a week, dist/release-NN/ (student notebooks, the student package
# and its wheel holding the answers of chapters 1..NN only). `make release THROUGH=05`; see how_to_use.md.
release: $(STAMP)
	@test -n "$(THROUGH)" || { echo "usage: make release THROUGH=NN (the last chapter whose answers are released)"; exit 2; }
	$(BIN)/python -m autograder release --through $(THROUGH) --out dist

# Both sites: the English one into _build/html, the Chinese one (zh/) into _build/html/zh.
book: $(STAMP) $(JS_STAMP)
	$(BIN)/python scripts/make_chapters.py --check || $(MAKE) chapters
	$(BIN)/jupyter-book build . -W --keep-going
	$(BIN)/python scripts/translations.py build _build/html
	@echo "Open _build/html/index.html in a browser (中文: _build/html/zh/index.html)."

test: $(STAMP) $(JS_STAMP)
	$(PYTEST) -n 2 --dist worksteal --cov=tfm_solution --cov-report=term --cov-fail-under=95

test-fast: $(STAMP)
	$(PYTEST) -m fast -q

clean:
	rm -rf _build .pytest_cache .coverage
