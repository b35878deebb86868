"""Mutants of an SQL exercise's reference, made by editing PostgreSQL's own syntax tree (pglast).

Each operator is one class of mistake a learner makes: another lock strength or wait policy, another
comparison, a predicate dropped or negated, another column or parameter, the other clock, another ON
CONFLICT, no LIMIT, another value of a setting or a SET that does not last (SET LOCAL, RESET). A
mutant is a whole file a learner could have written: the reference's header and `-- name:` lines kept,
every query deparsed the same way, one query edited. What this does not do: run anything (mutants.py
runs the checker on each), or know which mutants are equivalent.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from functools import cache

from pglast import ast, parse_sql
from pglast.enums import (
    A_Expr_Kind,
    BoolExprType,
    LockClauseStrength,
    LockWaitPolicy,
    NullTestType,
    OnConflictAction,
    VariableSetKind,
)
from pglast.parser import ParseError, scan
from pglast.stream import IndentedStream, RawStream

from reliableq import sql
from reliableq.lab.exercises.mutant import Edit, Mutant

COMPARISONS = ("<", "<=", ">", ">=", "=", "<>")
STRENGTHS = {LockClauseStrength.LCS_FORUPDATE: "FOR UPDATE", LockClauseStrength.LCS_FORNOKEYUPDATE: "FOR NO KEY UPDATE",
             LockClauseStrength.LCS_FORSHARE: "FOR SHARE", LockClauseStrength.LCS_FORKEYSHARE: "FOR KEY SHARE"}
WAITS = {LockWaitPolicy.LockWaitSkip: " SKIP LOCKED", LockWaitPolicy.LockWaitError: " NOWAIT",
         LockWaitPolicy.LockWaitBlock: ""}
CLOCKS = ("now", "clock_timestamp")
# The values a setting an exercise sets can take, each swapped for the others.
SETTING_VALUES = {"synchronous_commit": ("off", "local", "remote_write", "on", "remote_apply")}
STATEMENTS = (ast.SelectStmt, ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)
# The clauses whose conjuncts and disjuncts are dropped or negated one at a time.
PREDICATE_SLOTS = {ast.SelectStmt: "whereClause", ast.UpdateStmt: "whereClause", ast.DeleteStmt: "whereClause",
                   ast.JoinExpr: "quals", ast.OnConflictClause: "whereClause"}


# -- placeholders: psycopg's %(name)s <-> PostgreSQL's $n -----------------------------------------------


def to_numbered(text: str) -> tuple[str, list[str]]:
    """`text` with each %(name)s as $n (numbered in order of first use, as psycopg sends it) and %% as %,
    and the names in number order. Tokens, not a pattern: a % inside a string literal stays what it is."""
    names: list[str] = []
    out, i = [], 0
    while i < len(text):
        if text.startswith("%%", i):
            out.append("%")
            i += 2
        elif text.startswith("%(", i) and (end := text.find(")s", i)) > 0 and text[i + 2:end].isidentifier():
            name = text[i + 2:end]
            if name not in names:
                names.append(name)
            out.append(f"${names.index(name) + 1}")
            i = end + 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out), names


def to_named(text: str, names: list[str]) -> str:
    """The inverse of to_numbered on a deparsed query: each $n token back to its %(name)s, every other %
    doubled (psycopg would read it as a placeholder). PostgreSQL's scanner finds the $n tokens."""
    out, at = [], 0
    for token in scan(text):  # offsets in characters, the end inclusive
        if token.name == "PARAM":
            out.append(text[at:token.start].replace("%", "%%"))
            out.append(f"%({names[int(text[token.start + 1:token.end + 1]) - 1]})s")
            at = token.end + 1
    out.append(text[at:].replace("%", "%%"))
    return "".join(out)


# -- the file: header and `-- name:` lines kept, query bodies deparsed --------------------------------


@dataclass(frozen=True)
class Query:
    name: str
    head: str  # the `-- name:` line and the comment lines right after it, as in the file
    tree: tuple  # pglast's statements, placeholders numbered
    names: list[str]  # the placeholders' names, in number order


def parse_file(text: str) -> tuple[str, list[Query]]:
    """The file's header (everything before the first `-- name:` line) and its queries."""
    blocks = text.split("\n-- name:")
    queries = []
    for block in blocks[1:]:
        lines = ("-- name:" + block).splitlines()
        body_at = next((n for n, line in enumerate(lines) if n and not line.startswith("--")), len(lines))
        name = lines[0].removeprefix("-- name:").strip()
        numbered, names = to_numbered(sql.parse_named("\n".join(lines), "reference")[name])
        queries.append(Query(name, "\n".join(lines[:body_at]), parse_sql(numbered), names))
    return blocks[0] + "\n", queries


def deparsed(query: Query, tree: tuple | None = None) -> str:
    """The query's text as a learner's file holds it: indented, its placeholders named."""
    return to_named(IndentedStream()(tree if tree is not None else query.tree), query.names) + ";"


def file_text(header: str, queries: list[Query], bodies: dict[str, str]) -> str:
    return header + "\n\n".join(f"{query.head}\n{bodies[query.name]}" for query in queries) + "\n"


# -- the operators ------------------------------------------------------------------------------------


def _children(node: object, cte: str = "") -> Iterator[tuple[object, str, int | None, ast.Node, str]]:
    """(parent, attribute, index or None, child, the name of the CTE it is in) for every node below `node`,
    depth first, in slot order."""
    for attribute in node:
        value = getattr(node, attribute)
        items = enumerate(value) if isinstance(value, tuple) else [(None, value)]
        for index, child in items:
            if isinstance(child, ast.Node):
                yield node, attribute, index, child, cte
                yield from _children(child, child.ctename if isinstance(child, ast.CommonTableExpr) else cte)


def _replace(parent: ast.Node, attribute: str, index: int | None, new: ast.Node | None) -> None:
    """`new` in place of parent.attribute (or its index-th item; None removes the item)."""
    if index is None:
        setattr(parent, attribute, new)
        return
    items = list(getattr(parent, attribute))
    if new is None:
        del items[index]
    else:
        items[index] = new
    setattr(parent, attribute, tuple(items))


def edits(tree: tuple, names: list[str]) -> list[Edit]:
    """Every single edit of `tree` the operators make, in a fixed order (the same tree gives the same list,
    so the n-th edit of a fresh parse is the same mutant)."""
    def said(node: ast.Node) -> str:
        text = to_named(RawStream()(node), names)
        return f"`{text if len(text) <= 72 else text[:70] + '…'}`"  # a description, not the query

    nodes = [(None, None, None, statement.stmt, "") for statement in tree]
    nodes += [child for statement in tree for child in _children(statement.stmt)]
    operands: dict[str, set[str]] = {}  # per CTE: a column is in scope in its own CTE only
    for _, _, _, node, cte in nodes:
        if isinstance(node, ast.ColumnRef) and _is_operand(node, nodes) and _types(node):
            operands.setdefault(cte, set()).add(RawStream()(node))
    params = sorted({node.number for _, _, _, node, _ in nodes if isinstance(node, ast.ParamRef)})
    found: list[Edit] = []
    for parent, attribute, index, node, cte in nodes:
        at = len(found)
        found += _lock_edits(node)
        found += _comparison_edits(node, said)
        found += _predicate_edits(node, said)
        found += _on_conflict_edits(node)
        found += _setting_edits(node)
        if isinstance(node, ast.SelectStmt) and node.limitCount is not None:
            found.append(Edit("limit", f"LIMIT {said(node.limitCount)} removed",
                              lambda node=node: setattr(node, "limitCount", None)))
        if isinstance(node, ast.FuncCall) and _function(node) in CLOCKS:
            other = CLOCKS[1 - CLOCKS.index(_function(node))]
            found.append(Edit("clock", f"{said(node)} -> {other}()",
                              lambda node=node, other=other: setattr(node, "funcname", (ast.String(sval=other),))))
        if isinstance(node, ast.ColumnRef) and _is_operand(node, nodes):
            for column in sorted(operands.get(cte, ())):
                if column != RawStream()(node) and _types(node) & _types(column):
                    replacement = parse_sql(f"SELECT {column}")[0].stmt.targetList[0].val
                    found.append(Edit("column", f"{said(parent)}: {said(node)} -> `{column}`",
                                      lambda p=parent, a=attribute, i=index, r=replacement: _replace(p, a, i, r)))
        if isinstance(node, ast.ParamRef):
            for number in params:
                if number != node.number:
                    # A parameter right under a statement (its LIMIT) is named by its clause.
                    where = attribute if isinstance(parent, STATEMENTS) else said(parent)
                    found.append(Edit("parameter", f"{where}: %({names[node.number - 1]})s -> "
                                                   f"%({names[number - 1]})s",
                                      lambda node=node, number=number: setattr(node, "number", number)))
        if cte:  # where in the query: the same words may stand in two CTEs
            found[at:] = [Edit(edit.operator, f"{cte}: {edit.description}", edit.apply) for edit in found[at:]]
    return found


@cache
def _schema_types() -> dict[str, frozenset[str]]:
    """Column name -> its types in the schemas' tables (one name may be several tables' columns)."""
    types: dict[str, set[str]] = {}
    for database in ("queue", "charge"):
        for statement in parse_sql(sql.schema(database)):
            if isinstance(statement.stmt, ast.CreateStmt):
                for column in statement.stmt.tableElts:
                    if isinstance(column, ast.ColumnDef):
                        types.setdefault(column.colname, set()).add(column.typeName.names[-1].sval)
    return {name: frozenset(found) for name, found in types.items()}


def _types(column: ast.ColumnRef | str) -> frozenset[str]:
    """The types a column reference (or its text) may have, by its last name; none for a name no table
    has (a CTE's own output column)."""
    name = column.fields[-1].sval if isinstance(column, ast.ColumnRef) else column.rsplit(".", 1)[-1]
    return _schema_types().get(name, frozenset())


def _function(node: ast.FuncCall) -> str:
    return node.funcname[-1].sval


def _is_operand(node: ast.ColumnRef, nodes: list) -> bool:
    """Whether the column is a side of a comparison: there another column of the same type is a mistake
    PostgreSQL lets run (only those are tried: a mutant of another type is refused before it runs)."""
    return any(isinstance(parent, ast.A_Expr) and child is node for parent, _, _, child, _ in nodes)


def _lock_edits(node: ast.Node) -> list[Edit]:
    if not isinstance(node, ast.SelectStmt) or not node.lockingClause:
        return []
    clause = node.lockingClause[0]
    found = []
    for strength, strength_said in STRENGTHS.items():
        for wait, wait_said in WAITS.items():
            if (strength, wait) != (clause.strength, clause.waitPolicy):
                found.append(Edit("lock", f"lock {STRENGTHS[clause.strength]}{WAITS[clause.waitPolicy]} -> "
                                          f"{strength_said}{wait_said}",
                                  lambda s=strength, w=wait: (setattr(clause, "strength", s),
                                                              setattr(clause, "waitPolicy", w))))
    found.append(Edit("lock", f"lock {STRENGTHS[clause.strength]}{WAITS[clause.waitPolicy]} removed",
                      lambda: setattr(node, "lockingClause", None)))
    return found


def _comparison_edits(node: ast.Node, said: Callable[[ast.Node], str]) -> list[Edit]:
    if isinstance(node, ast.A_Expr) and node.kind == A_Expr_Kind.AEXPR_OP and node.name[-1].sval in COMPARISONS:
        return [Edit("comparison", f"{said(node)}: {node.name[-1].sval} -> {op}",
                     lambda op=op: setattr(node, "name", (ast.String(sval=op),)))
                for op in COMPARISONS if op != node.name[-1].sval]
    if isinstance(node, ast.A_Expr) and node.kind in (A_Expr_Kind.AEXPR_DISTINCT, A_Expr_Kind.AEXPR_NOT_DISTINCT):
        other = (A_Expr_Kind.AEXPR_NOT_DISTINCT if node.kind == A_Expr_Kind.AEXPR_DISTINCT
                 else A_Expr_Kind.AEXPR_DISTINCT)
        return [Edit("comparison", f"{said(node)}: IS {'NOT ' if other == A_Expr_Kind.AEXPR_NOT_DISTINCT else ''}"
                                   "DISTINCT FROM", lambda: setattr(node, "kind", other))]
    if isinstance(node, ast.NullTest):
        other = NullTestType.IS_NOT_NULL if node.nulltesttype == NullTestType.IS_NULL else NullTestType.IS_NULL
        return [Edit("comparison", f"{said(node)}: {'IS NOT NULL' if other else 'IS NULL'}",
                     lambda: setattr(node, "nulltesttype", other))]
    return []


def _predicate_edits(node: ast.Node, said: Callable[[ast.Node], str]) -> list[Edit]:
    """Each conjunct and disjunct of a WHERE, ON or ON CONFLICT WHERE (nested ones too) removed, and
    negated; a condition that is a single predicate removed whole."""
    slot = PREDICATE_SLOTS.get(type(node))
    if slot is None or getattr(node, slot) is None:
        return []
    found = []

    def visit(parent: ast.Node, attribute: str, index: int | None, predicate: ast.Node) -> None:
        if isinstance(predicate, ast.BoolExpr) and predicate.boolop != BoolExprType.NOT_EXPR:
            for n, arg in enumerate(predicate.args):
                visit(predicate, "args", n, arg)
            return
        if isinstance(parent, ast.BoolExpr):
            found.append(Edit("predicate", f"{said(predicate)} removed",
                              lambda: _drop_arg(parent, index)))
        else:
            found.append(Edit("predicate", f"{said(predicate)} removed (the whole condition)",
                              lambda: setattr(parent, attribute, None)))
        negated = (predicate.args[0] if isinstance(predicate, ast.BoolExpr)
                   else ast.BoolExpr(boolop=BoolExprType.NOT_EXPR, args=(predicate,)))
        found.append(Edit("predicate", f"{said(predicate)} negated",
                          lambda: _replace(parent, attribute, index, negated)))

    visit(node, slot, None, getattr(node, slot))
    return found


def _drop_arg(expression: ast.BoolExpr, index: int) -> None:
    _replace(expression, "args", index, None)
    # A BoolExpr of one argument deparses as that argument; pglast prints it either way, PostgreSQL too.


def _on_conflict_edits(node: ast.Node) -> list[Edit]:
    if not isinstance(node, ast.InsertStmt) or node.onConflictClause is None:
        return []
    clause = node.onConflictClause
    columns = [target.name for target in node.cols or ()]
    found = [Edit("on-conflict", "ON CONFLICT removed", lambda: setattr(node, "onConflictClause", None))]
    if clause.action == OnConflictAction.ONCONFLICT_NOTHING:
        if clause.infer is not None:
            found.append(Edit("on-conflict", "ON CONFLICT DO NOTHING: conflict target removed",
                              lambda: setattr(clause, "infer", None)))
            # The upsert a learner writes: the repeat's values over the original's.
            upsert = parse_sql("INSERT INTO t VALUES (1) ON CONFLICT (k) DO UPDATE SET "
                               + ", ".join(f"{c} = excluded.{c}" for c in columns))[0].stmt.onConflictClause
            found.append(Edit("on-conflict", "DO NOTHING -> DO UPDATE SET every column = excluded's",
                              lambda: (setattr(clause, "action", OnConflictAction.ONCONFLICT_UPDATE),
                                       setattr(clause, "targetList", upsert.targetList))))
    else:
        found.append(Edit("on-conflict", "DO UPDATE -> DO NOTHING",
                          lambda: (setattr(clause, "action", OnConflictAction.ONCONFLICT_NOTHING),
                                   setattr(clause, "targetList", None), setattr(clause, "whereClause", None))))
    return found


def _setting_edits(node: ast.Node) -> list[Edit]:
    if not isinstance(node, ast.VariableSetStmt) or node.kind != VariableSetKind.VAR_SET_VALUE:
        return []
    found = [Edit("setting", f"SET {node.name} -> SET LOCAL", lambda: setattr(node, "is_local", not node.is_local)),
             Edit("setting", f"SET {node.name} -> RESET",
                  lambda: (setattr(node, "kind", VariableSetKind.VAR_RESET), setattr(node, "args", None)))]
    now = node.args[0].val.sval if len(node.args or ()) == 1 and isinstance(node.args[0].val, ast.String) else None
    for value in SETTING_VALUES.get(node.name, ()):
        if value != now:
            found.append(Edit("setting", f"{node.name} {now} -> {value}",
                              lambda value=value: setattr(node, "args", (ast.A_Const(val=ast.String(sval=value)),))))
    return found


# -- mutants of a file ----------------------------------------------------------------------------------


def mutants(reference: str, operators: Collection[str] | None = None) -> tuple[str, list[Mutant]]:
    """The baseline (the reference with every query deparsed: what each mutant differs from by one edit)
    and every mutant of `reference` (only those of `operators`, if given: deparsing is most of the time). A
    mutant that pglast cannot deparse, or that deparses to its query's own text, is left out."""
    header, queries = parse_file(reference)
    bodies = {query.name: deparsed(query) for query in queries}
    baseline = file_text(header, queries, bodies)
    found: list[Mutant] = []
    seen: dict[str, int] = {}
    for query in queries:
        numbered = RawStream()(query.tree)
        for n, planned in enumerate(edits(query.tree, query.names)):  # read for their operators, not applied
            if operators is not None and planned.operator not in operators:
                continue
            tree = parse_sql(numbered)  # a fresh tree for each edit: edits work in place
            edit = edits(tree, query.names)[n]
            edit.apply()
            try:
                body = deparsed(query, tree)
                parse_sql(to_numbered(body)[0])
            except (ParseError, ValueError, KeyError, AttributeError, IndexError):
                continue  # no text PostgreSQL would parse
            if body == bodies[query.name]:
                continue
            description = f"{query.name}: {edit.description}"
            seen[description] = seen.get(description, 0) + 1
            if seen[description] > 1:  # the same words at two places of one CTE: numbered in order
                description += f" #{seen[description]}"
            text = file_text(header, queries, {**bodies, query.name: body})
            found.append(Mutant(edit.operator, description, text))
    return baseline, found
