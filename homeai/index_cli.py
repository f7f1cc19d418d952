"""`homeai index PATH... [--config FILE] [--no-summaries]`: index folders now, in this process.

Assembles the program (`homeai.app.loaded`: the model with its embedding model, the engine, the
store, the jobs), runs the index job over PATHs (default: the config's `jobs.index_paths`) with a
progress bar, prints what changed, and exits. Killed midway, the next run picks up where it
stopped. Runs as `python -m homeai.index_cli index PATH...` too; `homeai/cli.py` wires
`add_index_parser` into `homeai`.
"""

from __future__ import annotations

import argparse
import sys

from homeai import config as config_mod


def add_index_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("index", help="index folders of documents now (text, Markdown, HTML, PDF)")
    parser.add_argument("paths", nargs="*", metavar="PATH", help="folders or files (default: jobs.index_paths)")
    parser.add_argument("--no-summaries", action="store_true", help="index only; summarise on a later run")
    parser.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.set_defaults(func=cmd_index)
    return parser


def cmd_index(cfg: config_mod.Config, args) -> int:
    from tqdm import tqdm

    from homeai.app import loaded
    from homeai.jobs.runs import JobBusy

    if not (args.paths or cfg.jobs.index_paths):
        print("homeai: nothing to index: name folders, or set jobs.index_paths in the config", file=sys.stderr)
        return 2
    with loaded(cfg, embeddings=True, store=True) as program:
        bar = tqdm(unit="doc", dynamic_ncols=True, file=sys.stderr)

        def show(progress) -> None:
            if progress.current:
                bar.set_postfix_str(_short(progress.current), refresh=False)
            if bar.total != progress.total:
                bar.total = progress.total
                bar.refresh()
            bar.update(progress.done - bar.n)  # redraws at most every tqdm.mininterval

        try:
            run_id = program.jobs.run("index", paths=args.paths or None,
                                      summarise=False if args.no_summaries else None, on_progress=show)
        except JobBusy as e:
            print(f"homeai: the index job is {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("homeai: interrupted; run it again to carry on where it stopped", file=sys.stderr)
            return 130
        finally:
            bar.close()
        run = program.jobs.run_info(run_id)
    for error in run["errors"]:
        print(f"  {error['item']}: {error['error']}", file=sys.stderr)
    print(f"index run {run['id']}: {run['status']}, {run['items_done']}/{run['items_total']} items, "
          f"{len(run['errors'])} errors")
    return 0 if run["status"] == "done" else 1


def _short(text: str, width: int = 48) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="homeai")
    parser.add_argument("--config", help="TOML config file (default: $HOMEAI_CONFIG, else built-in defaults)")
    add_index_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        cfg = config_mod.load(config_mod.resolve_path(args.config))
    except config_mod.ConfigError as e:
        print(f"homeai: config error: {e}", file=sys.stderr)
        return 2
    return args.func(cfg, args)


if __name__ == "__main__":
    raise SystemExit(main())
