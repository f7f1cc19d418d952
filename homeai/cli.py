"""The `homeai` command: serve, doctor, members, bench, index, pull, models.

    homeai serve [--config FILE] [--host H] [--port P]
    homeai doctor [--config FILE]
    homeai members add NAME [--admin] [--lane LANE] [--lanes LANE,...] [--proxy] | lane NAME [LANE] | lanes NAME LANE,...
                   | proxy NAME [--off] | list | revoke NAME | revoke --prefix PREFIX
    homeai index [PATH...] [--no-summaries]
    homeai pull hf.co/<org>/<repo>[:<quantisation or file>]
    homeai models [list | rm NAME | clean]
    homeai bench engine [--seqs 1,4,8,16] [--tokens 64]
    homeai bench grammar [--seqs 1,8] [--tokens 64] [--reps 3]
    homeai bench voice [--n 10] [--out bench-out] [--quick]
    homeai bench http --peer URL [--url URL] [--quick]
    homeai bench members [--samples 20] [--streams 30] [--carol-turns 10] [--trickle 1000] [--quick] [--out bench-out]
    homeai bench owui [--users 2] [--turns 2] [--max-tokens 32] [--tools 36] [--overlap] [--quick] [--out bench-out]

The config file comes from --config, else $HOMEAI_CONFIG, else the built-in defaults.
"""

from __future__ import annotations

import argparse
import sys

from homeai import config as config_mod
from homeai.bench.cli import add_bench_parser
from homeai.index_cli import add_index_parser
from homeai.models_cli import add_model_parsers


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        cfg = config_mod.load(config_mod.resolve_path(args.config))
        return args.func(cfg, args) or 0
    except config_mod.ConfigError as e:
        print(f"homeai: config error: {e}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="homeai", description="A home AI server: one model, the whole household.")
    parser.add_argument("--config", help="TOML config file (default: $HOMEAI_CONFIG, else built-in defaults)")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8700)")
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(func=cmd_serve)

    doctor = sub.add_parser("doctor", help="why is it slow or broken? print what will be used")
    doctor.set_defaults(func=cmd_doctor)

    members = sub.add_parser("members", help="household members and their tokens")
    msub = members.add_subparsers(dest="action", required=True)
    add = msub.add_parser("add", help="add a member and print a new token")
    add.add_argument("name")
    add.add_argument("--admin", action="store_true")
    add.add_argument("--lane", help="the member's default lane, for requests that name none (e.g. voice: "
                     "then they may use voice too)")
    add.add_argument("--lanes", help="the lanes the member may use, comma-separated (default: chat,summaries,"
                     "indexing,embeddings and the --lane; admins may use every lane)")
    add.add_argument("--proxy", action="store_true", help="a trusted proxy (Open WebUI): the user named in its "
                     "[clients] proxy_user_header is shared fairly as a key of its own")
    lane = msub.add_parser("lane", help="set a member's default lane (none given: clear it)")
    lane.add_argument("name")
    lane.add_argument("lane", nargs="?")
    lanes = msub.add_parser("lanes", help="set the lanes a member may use, e.g. chat,voice")
    lanes.add_argument("name")
    lanes.add_argument("lanes")
    proxy = msub.add_parser("proxy", help="mark a member as a trusted proxy (--off: no longer)")
    proxy.add_argument("name")
    proxy.add_argument("--off", action="store_true")
    token = msub.add_parser("token", help="print one more token for a member")
    token.add_argument("name")
    msub.add_parser("list", help="list members and their token prefixes")
    revoke = msub.add_parser("revoke", help="revoke all tokens of a member, or one by prefix")
    revoke.add_argument("name", nargs="?")
    revoke.add_argument("--prefix")
    members.set_defaults(func=cmd_members)

    add_index_parser(sub)
    add_model_parsers(sub)

    bench_parsers = add_bench_parser(sub)
    # Subcommands also take --config after their name.
    for p in (serve, doctor, members, add, lane, lanes, proxy, token, revoke, *bench_parsers):
        p.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def cmd_serve(cfg: config_mod.Config, args) -> int:
    from homeai.engine.template import TemplateCompileError, check_configured

    try:  # the model loads after the server starts: a template named wrong stops it here instead
        check_configured(cfg.model.chat_template)
    except TemplateCompileError as e:
        raise config_mod.ConfigError(f"{cfg.source}: {e}") from None
    from homeai.api.app import create_app
    from homeai.api.shutdown import serve
    from homeai.app import Program

    cfg = config_mod.with_overrides(cfg, host=args.host, port=args.port)
    remotes = "".join(f", {lane} lane -> {r.url}" for lane, r in cfg.remotes.items())
    print(f"homeai: serving on http://{cfg.server.host}:{cfg.server.port} (config: {cfg.source}{remotes})", flush=True)
    return serve(create_app(Program(cfg)), cfg, log_level=args.log_level)


def cmd_doctor(cfg: config_mod.Config, args) -> int:
    from homeai.doctor import facts, render

    print(render(facts(cfg)))
    return 0


def _session(cfg):
    from homeai.store.db import make_engine, make_sessionmaker, migrate

    engine = make_engine(cfg.database_url)
    migrate(engine)
    return make_sessionmaker(engine)()


def cmd_members(cfg: config_mod.Config, args) -> int:
    from homeai.store import members

    with _session(cfg) as session:
        try:
            if args.action == "add":
                member, token = members.add_member(session, name=args.name, admin=args.admin,
                                                   lane=_known_lane(cfg, args.lane), lanes=_lane_list(args.lanes),
                                                   proxy=args.proxy)
                print(f"added {member.name} ({member.role}{', proxy' if args.proxy else ''}, "
                      f"lanes: {_lanes_text(members, member)}); "
                      f"token (shown once): {token}")
            elif args.action == "lane":
                members.set_default_lane(session, name=args.name, lane=_known_lane(cfg, args.lane))
                print(f"{args.name}'s default lane: {args.lane or '(none)'}")
            elif args.action == "lanes":
                allowed = members.set_lanes(session, name=args.name, lanes=_lane_list(args.lanes))
                print(f"{args.name} may use: {','.join(allowed)}")
            elif args.action == "proxy":
                members.set_proxy(session, name=args.name, proxy=not args.off)
                print(f"{args.name} is {'no longer ' if args.off else ''}a trusted proxy "
                      f"(its users named by {cfg.clients.proxy_user_header})")
            elif args.action == "token":
                print(members.add_token(session, name=args.name))
            elif args.action == "list":
                for m in members.list_members(session):
                    lane = f"lane: {m.settings.default_lane}  " if m.settings and m.settings.default_lane else ""
                    proxy = "proxy  " if members.is_proxy(m) else ""
                    print(f"{m.name:20} {m.role:7} {proxy}{lane}lanes: {_lanes_text(members, m)}  "
                          f"tokens: {', '.join(m.active_prefixes) or '-'}")
            elif args.action == "revoke":
                if not args.name and not args.prefix:
                    print("homeai: revoke needs a NAME or --prefix", file=sys.stderr)
                    return 2
                n = members.revoke(session, name=args.name, prefix=args.prefix)
                print(f"revoked {n} token(s)")
        except ValueError as e:
            print(f"homeai: {e}", file=sys.stderr)
            return 1
    return 0


def _known_lane(cfg: config_mod.Config, lane: str | None) -> str | None:
    if lane is not None and lane not in cfg.lanes:
        raise ValueError(f"unknown lane {lane!r} (known: {', '.join(cfg.lanes)})")
    return lane


def _lane_list(text: str | None) -> list[str] | None:
    """`--lanes chat,voice` as a list (the store checks the names); None when not given."""
    return None if text is None else [lane for lane in text.split(",") if lane.strip()]


def _lanes_text(members, member) -> str:
    return "all" if member.is_admin else ",".join(members.allowed_lanes(member))


if __name__ == "__main__":
    raise SystemExit(main())
