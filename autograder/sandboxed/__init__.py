"""The code that runs inside the sandbox, and nothing else: a grading worker's whole program.

Everything here runs in the worker, beside the student's code, with the standard library, torch and numpy only,
and imports nothing of the grader but its own modules (relative imports; ``tests/test_trust_boundary.py`` checks
it). The grader ships this package into the worker's view as one zip and runs it (``python -I -S -u -B
/grader/sandboxed.pyz``); grader-side, the same files load as ``autograder.sandboxed`` for the wire format and for
computing the reference's record with the very procedure the worker uses.

- ``wire``: the frames and the value format (pack, unpack), the one definition of what crosses;
- ``jail``: closing and checking the sandbox, limits, namespaces, blocked imports;
- ``procedure``: a graded call and what is measured beside it (inputs after the call, generators, structure,
  initial values, the stand-ins for dropout and conv1d): the part the answer could in principle rewrite, which
  is why the grader reads the answer's code first (``autograder.reach``);
- ``drivers``: the fixed procedures some cases run around the answer (training loops, the capstone);
- ``__main__``: the fork server and a worker's life.
"""
