"""The routes stay thin (issue 30): they parse, authorise and call a service. No module of
server/api/ builds SQL (sqlalchemy's select/insert/update/delete) or runs it on a session, and
every route that changes state writes through TxDep (one transaction, tasks enqueued after its
commit), never through SessionDep (a read's session: a task enqueued there would be dropped)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
API = sorted((ROOT / "server" / "api").glob("*.py"))
SQL_BUILDERS = {"select", "insert", "update", "delete", "text"}
SESSION_CALLS = {"execute", "scalar", "scalars", "add", "add_all", "merge", "delete", "flush"}
WRITE_VERBS = {"post", "put", "patch", "delete"}


def _sql_in(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            found += [f"imports {a.name} from {node.module}" for a in node.names if a.name in SQL_BUILDERS]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in ("session", "s", "db")
                and node.func.attr in SESSION_CALLS):
            found.append(f"line {node.lineno}: {node.func.value.id}.{node.func.attr}(...)")
    return found


def test_no_route_module_builds_or_runs_sql():
    offenders = {p.name: got for p in API if (got := _sql_in(ast.parse(p.read_text())))}
    assert not offenders, f"SQL in server/api/ (move it into a service): {offenders}"


def test_the_scan_sees_sql_where_there_is_some():
    """The check above would catch a route that queries for itself."""
    route = ast.parse("from sqlalchemy import select\n"
                      "def get(session):\n    return session.scalar(select(1))\n")
    assert len(_sql_in(route)) == 2


def _write_routes_on_a_read_session(tree: ast.Module) -> list[str]:
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        verbs = {d.func.attr for d in fn.decorator_list
                 if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr in WRITE_VERBS}
        params = [a for a in (*fn.args.args, *fn.args.kwonlyargs)]
        if verbs and any(isinstance(a.annotation, ast.Name) and a.annotation.id == "SessionDep" for a in params):
            out.append(f"{fn.name} ({', '.join(sorted(verbs)).upper()})")
    return out


def test_every_route_that_changes_state_writes_through_txdep():
    offenders = {p.name: got for p in API if (got := _write_routes_on_a_read_session(ast.parse(p.read_text())))}
    assert not offenders, f"state-changing routes on SessionDep (use TxDep: `with tx() as session:`): {offenders}"
    route = ast.parse('@router.post("/x")\ndef make(session: SessionDep): ...\n')
    assert _write_routes_on_a_read_session(route) == ["make (POST)"]
