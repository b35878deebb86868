"""Mutants of a Python exercise's reference, made by editing its `ast`.

Each operator is one class of mistake a learner makes: another comparison or arithmetic operator, a
constant one off (the boundary), `and` for `or`, a statement left out or two swapped, an `await`
forgotten, a condition negated, another of the allowed answers returned. A mutant is the whole module
unparsed, so it differs from the baseline (the reference unparsed) by the one edit. What this does not
do: run anything, or know which mutants are equivalent.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from reliableq.lab.exercises.mutant import Edit, Mutant

COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
BOOLEAN = (ast.And, ast.Or)
SYMBOLS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Add: "+",
           ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
           ast.And: "and", ast.Or: "or"}


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _bodies(tree: ast.Module) -> Iterator[tuple[str, list[ast.stmt], int]]:
    """(function name, statement list, where its statements start) for each block inside a function: the
    docstring is not one of them (a docstring removed changes nothing)."""
    for function in _functions(tree):
        for node in ast.walk(function):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    yield function.name, block, int(node is function and ast.get_docstring(function) is not None)


def edits(tree: ast.Module, answers: tuple[str, ...] = ()) -> list[Edit]:
    """Every single edit of `tree`'s functions, in a fixed order (the same source gives the same list).
    `answers`: the strings the function may return, swapped for one another."""
    found: list[Edit] = []
    for function in _functions(tree):
        where = function.name
        for node in ast.walk(function):
            line = f"{where}, line {getattr(node, 'lineno', function.lineno)}"
            found += _operator_edits(node, line)
            if isinstance(node, ast.Constant) and type(node.value) in (int, float):
                for delta in (1, -1):
                    found.append(Edit("constant", f"{line}: {node.value!r} -> {node.value + delta!r}",
                                      lambda node=node, delta=delta: setattr(node, "value", node.value + delta)))
            if isinstance(node, ast.Constant) and isinstance(node.value, bool):
                found.append(Edit("boolean", f"{line}: {node.value} -> {not node.value}",
                                  lambda node=node: setattr(node, "value", not node.value)))
            if isinstance(node, ast.If | ast.While | ast.IfExp):
                found.append(Edit("negation", f"{line}: `{ast.unparse(node.test)}` negated",
                                  lambda node=node: setattr(node, "test", ast.UnaryOp(ast.Not(), node.test))))
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and node.value.value in answers:
                for answer in answers:
                    if answer != node.value.value:
                        found.append(Edit("answer", f"{line}: return {node.value.value!r} -> {answer!r}",
                                          lambda node=node, answer=answer: setattr(node.value, "value", answer)))
            for child_field, child in ast.iter_fields(node):
                if isinstance(child, ast.Await):
                    found.append(Edit("await", f"{line}: `{ast.unparse(child)}` without await",
                                      lambda n=node, f=child_field, c=child: setattr(n, f, c.value)))
    for where, block, start in _bodies(tree):
        found += _statement_edits(where, block, start)
    return found


def _operator_edits(node: ast.AST, line: str) -> list[Edit]:
    """Another comparison, arithmetic or boolean operator in place of the one at `node`."""
    if isinstance(node, ast.Compare):
        return [Edit("comparison", f"{line}: `{ast.unparse(node)}`: {SYMBOLS[type(op)]} -> {SYMBOLS[other]}",
                     lambda n=n, other=other: node.ops.__setitem__(n, other()))
                for n, op in enumerate(node.ops) if type(op) in COMPARISONS
                for other in COMPARISONS if other is not type(op)]
    if isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in ARITHMETIC:
        return [Edit("arithmetic", f"{line}: `{ast.unparse(node)}`: {SYMBOLS[type(node.op)]} -> {SYMBOLS[other]}",
                     lambda other=other: setattr(node, "op", other()))
                for other in ARITHMETIC if other is not type(node.op)]
    if isinstance(node, ast.BoolOp):
        other = BOOLEAN[1 - BOOLEAN.index(type(node.op))]
        return [Edit("boolean", f"{line}: `{ast.unparse(node)}`: {SYMBOLS[type(node.op)]} -> {SYMBOLS[other]}",
                     lambda: setattr(node, "op", other()))]
    return []


def _statement_edits(where: str, block: list[ast.stmt], start: int) -> list[Edit]:
    """Each statement of `block` from `start` on removed (a block left empty holds `pass`), and each
    adjacent pair swapped."""
    found = []
    for statement in block[start:]:
        found.append(Edit("statement", f"{where}, line {statement.lineno}: `{_first_line(statement)}` removed",
                          lambda s=statement: _remove(block, start, s)))
    for i in range(start, len(block) - 1):
        found.append(Edit("statement", f"{where}, lines {block[i].lineno} and {block[i + 1].lineno}: "
                                       f"`{_first_line(block[i])}` and `{_first_line(block[i + 1])}` swapped",
                          lambda i=i: block.__setitem__(slice(i, i + 2), [block[i + 1], block[i]])))
    return found


def _first_line(statement: ast.stmt) -> str:
    return ast.unparse(statement).splitlines()[0]


def _remove(block: list[ast.stmt], start: int, statement: ast.stmt) -> None:
    block.remove(statement)
    if len(block) == start:
        block.append(ast.Pass())


def mutants(reference: str, answers: tuple[str, ...] = ()) -> tuple[str, list[Mutant]]:
    """The baseline (the reference unparsed: what each mutant differs from by one edit) and every mutant
    of `reference`; one that unparses to the reference's own tree is left out."""
    original = ast.parse(reference)
    baseline = ast.unparse(original) + "\n"
    found: list[Mutant] = []
    seen: dict[str, int] = {}
    for n in range(len(edits(original, answers))):
        tree = ast.parse(reference)  # a fresh tree for each edit: edits work in place
        edit = edits(tree, answers)[n]
        edit.apply()
        text = ast.unparse(tree) + "\n"
        if ast.dump(ast.parse(text)) == ast.dump(ast.parse(baseline)):
            continue
        seen[edit.description] = seen.get(edit.description, 0) + 1
        description = edit.description + (f" #{seen[edit.description]}" if seen[edit.description] > 1 else "")
        found.append(Mutant(edit.operator, description, text))
    return baseline, found

