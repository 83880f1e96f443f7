"""Code that reaches for the harness: read from the answer's source, before anything runs.

A worker measures some facts about an answer in the same process as the answer (its inputs after
the call, the random generators, gradients, a module's structure, the marks on torch's conv1d).
Python cannot keep one part of a process from another, so the grader reads the code it is about
to run (every chunk that reaches the worker, not only the answer cell: a decorator or a default
argument runs too) and refuses the exercise when the code reaches for what no exercise needs:
the interpreter's own machinery (frames, the module table, the garbage collector, code objects,
``eval``/``exec``/``compile``, names looked up from strings built at run time) or the attributes
through which a function's state is read. Such an answer earns nothing for that exercise, and the
feedback names what was found, for the student and the instructor alike.
"""

from __future__ import annotations

import ast

from autograder.extract import parsed, reachable
from autograder.feedback import code

# Modules whose whole purpose here would be to look inside the running interpreter.
MODULES = ("__main__", "builtins", "ctypes", "dis", "gc", "importlib", "inspect", "marshal", "sandboxed", "traceback")
# Parts of those modules that only read packaged files.
HARMLESS = ("importlib.metadata", "importlib.resources")
# Names that run or look up code from data, or hand out a namespace.
CALLS = ("__import__", "breakpoint", "compile", "eval", "exec", "globals", "locals", "vars")
# Built-ins that look an attribute up by name: fine with a fixed, ordinary name; not with a computed one.
BY_NAME = ("getattr", "setattr", "delattr", "hasattr")
# The same lookups by other routes (``operator``'s getters, the object protocol's own methods): any argument.
GETTERS = ("attrgetter", "methodcaller", "__getattribute__", "__getattr__", "__setattr__", "__delattr__")
# Attributes that open a function's, frame's or object's insides.
ATTRIBUTES = ("__builtins__", "__closure__", "__code__", "__defaults__", "__dict__", "__func__", "__globals__",
              "__kwdefaults__", "__self__", "__subclasses__", "__wrapped__", "ag_frame", "cr_frame", "f_back",
              "f_builtins", "f_code", "f_globals", "f_locals", "gi_frame", "tb_frame", "tb_next")
# Members of ``sys`` and ``types`` that lead to the same places.
MEMBERS = {"sys": ("modules", "_getframe", "_current_frames", "settrace", "setprofile", "meta_path", "path_hooks",
                   "addaudithook", "exc_info", "exception", "last_traceback", "gettrace", "getprofile"),
           "types": ("FunctionType", "CodeType", "FrameType", "TracebackType", "CellType", "LambdaType",
                     "MethodType", "ModuleType")}

WHY = ("your code reaches for the grader's own machinery ({found}); no exercise needs that, so this exercise "
       "earns no points. Your instructor sees this line. (Write the exercise with tensors and modules only: "
       "see \"What your code may use\" in the course's how-to.)")


def reaches(sources: list[str], answer: str = "") -> list[str]:
    """What reaches for the harness in the code a worker would run (``sources``, the normalised chunks), each
    named once, in the order found; empty when nothing does.

    Read whole: the ``answer`` cell's code (every chunk when it is not given) and every definition it uses,
    followed by name through the chunks. Of the other chunks, only what runs when the chunk runs (not the bodies
    of functions nobody calls): decorators, default arguments, class bodies, assigned values. Importing one of
    ``MODULES`` is no finding by itself; using what it bound is.
    """
    chunks = [parsed(source) for source in sources]
    answer_tree = parsed(answer)
    aliases, suspects = _imported(chunks + [answer_tree])
    found: dict[str, None] = {}
    whole = reachable(chunks, answer_tree) if answer else chunks
    for node in whole:
        for sub in ast.walk(node):
            for what in _findings(sub, aliases, suspects):
                found.setdefault(what, None)
    for tree in chunks:
        for sub in _runs_when_defined(tree):
            for what in _findings(sub, aliases, suspects):
                found.setdefault(what, None)
    return list(found)


def _imported(trees: list[ast.Module]) -> tuple[dict[str, str], dict[str, str]]:
    """(local name -> module, for every ``import m [as n]``; local name -> what it is, for every name bound by
    importing from one of ``MODULES``, or one of ``MEMBERS``)."""
    aliases, suspects = {}, {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    aliases[local] = alias.name if alias.asname else alias.name.split(".")[0]
                    if alias.name.split(".")[0] in MODULES and not alias.name.startswith(HARMLESS):
                        suspects[local] = f"import {alias.name}"
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                for alias in node.names:
                    if ((module.split(".")[0] in MODULES and not module.startswith(HARMLESS))
                            or alias.name in MEMBERS.get(module, ())):
                        suspects[alias.asname or alias.name] = f"{module}.{alias.name}"
    return aliases, suspects


def _runs_when_defined(tree: ast.Module):
    """The nodes of ``tree`` that run when it runs: all but the bodies of functions (and lambdas)."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo += [*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d),
                     *(a.annotation for a in (*node.args.args, *node.args.kwonlyargs) if a.annotation)]
            todo += [node.returns] if node.returns else []
        elif isinstance(node, ast.Lambda):
            todo += [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]
        else:
            todo += list(ast.iter_child_nodes(node))


def _findings(node: ast.AST, aliases: dict[str, str], suspects: dict[str, str]) -> list[str]:
    if isinstance(node, ast.Name) and node.id in suspects and isinstance(node.ctx, ast.Load):
        return [f"`{suspects[node.id]}`"]
    if isinstance(node, ast.Name) and node.id in CALLS + ATTRIBUTES:
        return [f"`{node.id}`"]
    if isinstance(node, ast.Attribute):
        if node.attr in ATTRIBUTES:
            return [f"`.{node.attr}`"]
        if isinstance(node.value, ast.Name) and node.attr in MEMBERS.get(aliases.get(node.value.id, ""), ()):
            return [f"`{aliases[node.value.id]}.{node.attr}`"]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ATTRIBUTES:
        return [f"`{node.value!r}`"]  # however it is looked up: attrgetter, __getattribute__, a dict
    called = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else \
        node.func.attr if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
    if called in GETTERS and not all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                     and not a.value.startswith("__")
                                     for a in node.args[called.startswith("__") and len(node.args) > 1:]):
        return [f"`{called}` with a name computed at run time or a special name"]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BY_NAME:
        name = node.args[1] if len(node.args) > 1 else None
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            return [f"`{node.func.id}` with a name computed at run time"]
        if name.value in ATTRIBUTES or name.value.startswith("__") and name.value.endswith("__"):
            return [f"`{node.func.id}(..., {name.value!r})`"]
    return []


def reach_line(found: list[str]) -> str:
    """The feedback line for an answer that reaches for the harness (``found``: ``reaches``'s findings)."""
    return WHY.format(found=", ".join(code(f.strip("`")) for f in found[:6]) + (" ..." if len(found) > 6 else ""))
