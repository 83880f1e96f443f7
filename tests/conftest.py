import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic():
    """Every test starts from the same seed and thread count, whatever ran before."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    yield


#: The suite's longest tests, longest first (minutes each on two cores). ``make test`` runs two workers with
#: ``--dist worksteal``, which hands each worker one half of the collection: these go to the heads of the two
#: halves in turn, so each starts early on a worker of its own instead of running alone at the end.
LONGEST = ("test_nbgrader_round_trip_full_marks_for_solutions_zero_for_stubs", "test_regenerating_changes_nothing",
           "test_nbval_on_the_solutions", "test_pip_install_alone_runs_every_chapter_with_its_widgets",
           "test_browser_every_page_renders_math_and_responsive_widgets_offline",
           "test_gradescope_package_round_trip_in_a_fresh_venv")


def pytest_collection_modifyitems(config, items):
    def name(item) -> str:  # a test function's name without its parameters (items of plugins may have none)
        return getattr(item, "originalname", item.name)

    longest = sorted((i for i in items if name(i) in LONGEST), key=lambda i: LONGEST.index(name(i)))
    rest = [i for i in items if name(i) not in LONGEST]
    first, second = longest[0::2], longest[1::2]
    cut = max(len(items) // 2 - len(first), 0)
    items[:] = first + rest[:cut] + second + rest[cut:]
