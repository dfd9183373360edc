"""sme2-farm: the command line, its parser and dispatch. `up`/`demo` run the whole farm on one
machine (server, worker, beat, a local agent: farm/up.py, farm/processes.py, farm/demo.py); the
other commands are admin chores (farm/admin.py: migrate, tokens; farm/runners_cmd.py: building and
listing runners, the emulator)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from sme2farm.farm import runners_cmd

# `up`, `demo`, `migrate` and `token` need the server's code (its database, web and queue
# libraries: seconds to import); each is imported when its command runs, so `runners`,
# `emulator` and `build-runner` do not load it.


def _up(args) -> int:
    from sme2farm.farm import up

    return up.cmd_up(args)


def _demo(args) -> int:
    from sme2farm.farm import demo

    return demo.cmd_demo(args)


def _migrate(args) -> int:
    from sme2farm.farm import admin

    return admin.cmd_migrate(args)


def _store(args) -> int:
    from sme2farm.farm import store_cmd

    return store_cmd.cmd_store(args)


def _token(args) -> int:
    from sme2farm.farm import admin

    return admin.cmd_token(args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sme2-farm", description="Run the SME2 device farm on this machine.")
    p.add_argument("--data-dir", default=os.environ.get("SME2_DATA_DIR"), help="default .farm (SME2_DATA_DIR)")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, fn, text in (("up", _up, "start server, worker and a local agent"),
                           ("demo", _demo, "start the farm and profile a bundled model with SME2 off and on")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--data-dir", default=argparse.SUPPRESS, help="as the top-level --data-dir")
        s.add_argument("--host", default="127.0.0.1")
        s.add_argument("--port", type=int, default=8000)
        s.add_argument("--drivers", default="local",
                       help="agent drivers, comma-separated: local, android, macos, qemu-arm64 (an emulated arm64 "
                            "Linux device: SME2 with `sme2-farm emulator install`)")
        s.add_argument("--manifest", help="runner manifest (default runners/build/manifest.json)")
        s.add_argument("--ready-timeout", type=float, default=60.0, metavar="S",
                       help="how long the local agent has to register a device before the farm gives up (exit 1)")
        s.set_defaults(fn=fn, exit=False)
        if name == "demo":
            s.add_argument("--exit", action="store_true", help="stop the farm once the demo has printed its report")
            s.add_argument("--model", default="toy_cnn", help="bundled example: toy_cnn, mlp, portable_mix, cnn_blocks")
            s.add_argument("--iterations", type=int, default=50)
            s.add_argument("--no-emulated", action="store_true",
                           help="on a host without SME2, do not add the emulated SME2 device (by default the demo "
                                "gets the SME2 emulator and the arm64 runner, and runs the model there too)")
    sub.add_parser("migrate", help="bring the database schema up to date").set_defaults(fn=_migrate)
    st = sub.add_parser("store", help="the artifact store: copy a file farm's artifacts into the S3 bucket")
    stsub = st.add_subparsers(dest="store_cmd", required=True)
    sc = stsub.add_parser("copy", help="copy the data dir's models, inputs, ETRecords, run artifacts and reports into "
                                       "SME2_ARTIFACT_STORE=s3://... (idempotent, digests checked)")
    sc.add_argument("--from", dest="source", help="the file farm's data dir (default: --data-dir)")
    st.set_defaults(fn=_store)
    t = sub.add_parser("token", help="API tokens: create, list, revoke")
    user_scopes = ["read", "submit", "admin", "register"]
    # the older form, `token --name N --scope S`, creates (scope `user` = submit)
    t.add_argument("--name", help=argparse.SUPPRESS)
    t.add_argument("--scope", choices=user_scopes + ["user"], help=argparse.SUPPRESS)
    tsub = t.add_subparsers(dest="token_cmd")
    tc = tsub.add_parser("create", help="mint a token and print it (once)")
    tc.add_argument("--name", required=True)
    tc.add_argument("--scope", choices=user_scopes + ["user"], default="submit",
                    help="read: GET the API; submit: also submit and cancel; admin: also tokens and agents; "
                         "register: register agents only (agents get their own token then)")
    tc.add_argument("--user", help="the user it belongs to, made if new (default: one named like the token); its "
                                   "experiments and suites are that user's")
    tc.add_argument("--team", help="put the user in this team, made if new: teammates may cancel, delete and "
                                   "acknowledge each other's work")
    tl = tsub.add_parser("list", help="every token: id, scope, state, creation time, name (never the token)")
    tl.add_argument("--json", action="store_true")
    tl.add_argument("--active", action="store_true", help="leave revoked tokens out")
    tr = tsub.add_parser("revoke", help="revoke a token by id: its next request is refused")
    tr.add_argument("token_id", type=int)
    t.set_defaults(fn=_token, token_cmd=None)
    b = sub.add_parser("build-runner", help="build and register a runner: the host's, or arm64 from the PyPI wheel")
    b.add_argument("--manifest")
    b.add_argument("--platform", default="host",
                   choices=["host", "linux-arm64", "android-arm64", "android-arm64-v9a", "macos-arm64"],
                   help="host (default): build against the installed wheel (on an arm64 host or Mac: SME2 on "
                        "and off); linux-arm64 / android-arm64: cross-compile against PyPI's aarch64 wheel and "
                        "register SME2 on and off; macos-arm64: the host build, on an Apple Silicon Mac")
    b.add_argument("--force", action="store_true", help="rebuild the arm64 runner even if up to date")
    b.add_argument("--dry-run", action="store_true",
                   help="print the commands and the builds it would register, run nothing (macos-arm64 on any "
                        "host, against the real macOS wheel)")
    b.set_defaults(fn=runners_cmd.cmd_build_runner)
    r = sub.add_parser("runners", help="list every registered runner build")
    r.add_argument("--manifest",
                   help="runner manifest (default runners/build/manifest.json, or SME2_RUNNER_MANIFEST)")
    r.add_argument("--json", action="store_true", help="machine-readable: one object per build")
    r.set_defaults(fn=runners_cmd.cmd_runners)
    e = sub.add_parser("emulator", help="the SME2-capable qemu-aarch64 for emulated arm64 devices: install, status")
    esub = e.add_subparsers(dest="emulator_cmd", required=True)
    esub.add_parser("install", help="fetch Debian's qemu-user from the first suite whose qemu-aarch64 has SME2 "
                                    "into the farm's cache (SME2_EMULATOR_DIR); idempotent")
    es = esub.add_parser("status", help="what is installed and whether its CPU has SME2 (exit 1 when the "
                                        "emulated devices would have no SME2)")
    es.add_argument("--json", action="store_true")
    e.set_defaults(fn=runners_cmd.cmd_emulator)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
