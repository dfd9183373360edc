"""The admin commands: migrate (the schema to head, and the production admin token) and token
(create, list, revoke API tokens), straight on the farm's database."""

from __future__ import annotations

import json
import sys

from sme2farm.farm.preflight import secure_data_dir, settings_for
from sme2farm.server.app import ensure_admin_token
from sme2farm.server.services import tokens as token_service
from sme2farm.server.store.db import migrate, session_scope


def cmd_migrate(args) -> int:
    settings = settings_for(args.data_dir)
    secure_data_dir(settings.data_dir)
    migrate(settings.sqlalchemy_url)
    print(f"schema at head on {settings.sqlalchemy_url.split('@')[-1]}")
    if settings.admin_token:  # production bootstrap (docker-compose's migrate step)
        ensure_admin_token(settings)
        print("admin token from SME2_ADMIN_TOKEN registered")
    return 0


def cmd_token(args) -> int:
    """token create --name N --scope S [--user U] [--team T] | token list [--json] | token revoke ID.
    The older form `token --name N --scope S` (no subcommand) still creates; its scope `user` is now
    `submit`."""
    what = args.token_cmd or "create"
    if what == "create" and not args.name:
        print("error: token create needs --name", file=sys.stderr)
        return 2
    settings = settings_for(args.data_dir)
    secure_data_dir(settings.data_dir)
    migrate(settings.sqlalchemy_url)
    with session_scope(settings.sqlalchemy_url) as session:
        if what == "create":
            scope = args.scope or "submit"
            try:
                user_id = token_service.user_for(session, scope=scope, name=args.name, user=getattr(args, "user", None),
                                                 team=getattr(args, "team", None))
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            # stdout carries the plaintext, once, for `$(sme2-farm token create ...)`; never logged
            print(token_service.create(session, name=args.name, scope=scope, user_id=user_id))
        elif what == "list":
            rows = token_service.list_all(session, include_revoked=not args.active)
            owners = token_service.owners_of(session, rows=rows)
            if args.json:
                print(json.dumps([{"id": r.id, "name": r.name, "scope": token_service.canonical(r.scope),
                                   "agent_id": r.agent_id, "created_at": r.created_at.isoformat(),
                                   "revoked": r.revoked, "user": owners[r.id][0], "team": owners[r.id][1]}
                                  for r in rows], indent=2))
            for r in [] if args.json else rows:
                user, team = owners[r.id]
                whose = f"  (user {user}{f', team {team}' if team else ''})" if user else ""
                print(f"{r.id:<6} {token_service.canonical(r.scope):<9} {'revoked' if r.revoked else 'active':<8} "
                      f"{r.created_at:%Y-%m-%d %H:%M}  {r.name}{whose}")
        else:
            row = token_service.revoke(session, token_id=args.token_id)
            if row is None:
                print(f"error: no token with id {args.token_id} (see `sme2-farm token list`)", file=sys.stderr)
                return 1
            print(f"revoked token {row.id} ({row.name}, {token_service.canonical(row.scope)}); "
                  f"its next request is refused")
    return 0
