"""One grading module per chapter; the registry finds them (``autograder.registry``).

How to add chapter NN's grading
-------------------------------
Create ``autograder/exercises/chNN_slug.py`` (``NN`` two digits, ``slug`` = the chapter folder's
slug, e.g. ``ch05_multihead_attention.py`` for ``05_multihead_attention``). Nothing else of the
grader changes: ``autograder.registry`` imports every ``chNN_*`` module of this folder in chapter
order and collects its ``EXERCISES``. Import only from ``autograder.exercises.shared``.

The module defines:

``EXERCISES``
    A tuple of ``Exercise(...)``, in the order the notebook asks them (keyword arguments; see
    ``shared.Exercise`` for every field). ``id`` is ``"chNN.name"``, ``chapter`` the folder
    name, ``name`` the top-level name the student defines, ``kind`` ``"function"``,
    ``"module"`` (an ``nn.Module``) or ``"class"``; ``solution_grade_id``/``test_grade_id`` are
    the nbgrader ids of the answer cell and of the graded cell (``make chapters`` writes the
    graded cell from the entry). ``reference`` is ``"tfm_solution.module:Name"``.
    ``prerequisites`` lists reference objects the answer may call (injected, so an earlier
    bug costs once).

case builders, one per exercise: ``def name_cases(seed: int) -> list[Case]``
    Passed as ``Exercise(cases=name_cases)``. Start with ``pub, gen = generators(seed)``: draw
    the public case's inputs from ``pub`` (fixed, may be shown to the student) and every
    hidden input from ``gen`` (fresh per submission), with ``randn``, ``dim`` and ``even``.
    One ``Case(title, checks, public, args, kwargs, rtol=, atol=)`` per graded call; ``checks``
    says in words what the case checks (students read it; never reveal inputs of hidden
    cases). For a module exercise, ``construct=(...)`` holds the constructor arguments: the
    student's module is built with them and given the reference's weights. For a plain class,
    ``attributes=(...)`` names the instance attributes compared.

declared mistakes: ``Exercise(mistakes={"snake_name": Mistake(message, source), ...})``
    Each is a wrong answer a student would write: ``source`` is a whole answer cell
    (``math`` and ``torch`` are imported for it) defining ``name``; ``message`` is what the
    student is told when their output matches it ("the scores are not divided by sqrt(d_k)").
    ``variants(TEMPLATE, slot=right, ...)`` makes the sources of several mistakes that differ
    from a right answer in one slot each. Every declared mistake must lose points on its own
    exercise only; the registry-driven tests check that for every chapter, with no edit.

module exercises (``kind="module"``) get more, from the shared machinery (``autograder.cases``)
    Give every case that builds the module a ``construct``, and set ``has_dropout=True`` when
    the notes' module applies dropout (its constructor takes ``dropout``; a test checks the flag
    against the reference). Then, with nothing more to write:

    * training-mode cases: copies of the first public and the first full-precision hidden case,
      run in ``train()`` mode with autograd on; the output and the gradients reaching the inputs
      and every parameter of the reference are compared. With ``has_dropout`` the constructor's
      ``dropout`` is set to ``cases.TRAIN_DROPOUT`` and every dropout call is one fixed stand-in
      (``sandboxed.procedure.FixedDropout``), on the student's side and the reference's alike. It stands in
      for ``torch.nn.functional.dropout`` itself, so ``nn.Dropout`` and a functional
      ``F.dropout(x, p, self.training)`` are graded the same; a functional call that omits
      ``training=self.training`` drops out in eval mode and fails the eval-mode cases. Dropout
      written by hand (a mask from ``torch.rand``) does not match the stand-in and fails. To
      choose these cases yourself, add ``Case(..., train=True)`` cases: then none are derived;
    * a structure line: the parameters, buffers (``requires_grad``, shapes) and ``state_dict``
      keys of the module as built, against the reference's, with a message naming each
      difference ("`pe` is a trainable parameter; ... use register_buffer"). Only the entries of
      the reference's ``state_dict`` that fit (same name and shape) are loaded into the
      student's module, so a structural slip costs this line, not every case.

    Declared mistakes are checked on these cases too: a mistake that only dropout or the
    structure shows (``no_dropout``, ``pe_trainable`` in chapter 2) is diagnosed there.

sublayers, factories and drivers (see ``shared.Case``)
    A constructor argument may describe a reference module, ``{"module": "MultiHeadedAttention", "h": 2,
    "d_model": 8, "dropout": 0.0}`` (list the class and what it needs in ``prerequisites``): both sides
    build it, and the answer gets the reference's weights; ``Case(distinct=True)`` adds seeded noise to
    them so copies differ (chapter 8). ``kind="factory"`` grades a function that returns a module like
    a module exercise (``Case.method`` calls ``decode`` or ``generator`` on it, ``measure="xavier"``
    judges its initialization). ``Case(driver=...)`` runs the answer inside a fixed procedure of the
    worker (chapter 9's training run).

the contract: ``Exercise(contract=Contract(...))`` (see ``shared.Contract``)
    What the exercise promises besides its values, as data: the dtype (kept, or fixed), the
    arguments gradients must reach, pure or not, may it draw random numbers, modes, attributes
    later code reads, initial values the text fixes, tie and boundary rules. ``make chapters``
    writes it at the end of the exercise's statement (``autograder.contract``), so the text
    states every clause; a visible test exercises each one and marks it ``# contract: <key>``;
    the harness checks every clause on every submission (``autograder.cases``): the arguments
    left bitwise unchanged, the generators untouched, float64 copies, gradient copies,
    attribute copies, initial values on the structure line. Give each tie or boundary rule a
    hidden case that exercises it.

alternatives and mutants: ``Exercise(alternatives={...}, mutants={...})``
    At least three correct answers the text allows (other operation orders, float64 inside,
    another library function: whole answer cells, as a mistake's source), graded at full marks
    on several seeds; and the wrong answers no declared mistake describes, each a
    ``Mutant(caught_by, source)`` naming the check that catches it (a key of ``shared.CHECKS``,
    a declared mistake or a case's title), graded below ``MUTANT_CEILING`` of the points.

Write the chapter's tests (visible tests vs the mistakes, if any) in ``tests/``; the
grader's own tests iterate over ``REGISTRY`` and cover the new module by themselves
(``tests/test_grading_contract.py``: contract, text, alternatives, mutants and mistakes).
"""
