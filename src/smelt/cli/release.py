"""The release command: `smelt release RUN OUT` and `smelt release --verify OUT`."""

from __future__ import annotations

import argparse

from smelt.errors import UserError


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "release",
        help="every checkpoint, the data order, logs, evals and cards for others",
        description="Package RUN into OUT like a model hub repository: the final model in Hugging Face format "
        "at the top, every milestone checkpoint under revisions/step_NNNNNNN/ (git branches when OUT is a git "
        "repository), the data order of each checkpoint, metrics, eval results, manifests, decisions, the "
        "report, and a model card and data card. `smelt release --verify OUT` re-hashes a release against its "
        "manifests and loads every revision in transformers.",
    )
    p.add_argument("run", nargs="?", help="run directory, e.g. runs/quickstart")
    p.add_argument("out", nargs="?", help="release directory to write (new, empty, or a git repository)")
    p.add_argument(
        "--verify", metavar="OUT", default=None, help="check an existing release instead of writing one"
    )
    p.add_argument(
        "--all-checkpoints",
        action="store_true",
        help="release every committed checkpoint, not only the milestones and the final one",
    )
    p.add_argument(
        "--license",
        dest="licenses",
        action="append",
        default=[],
        metavar="SOURCE=LICENSE",
        help="the licence of a data source for the data card (repeatable), e.g. --license stdlib=PSF-2.0",
    )
    p.add_argument(
        "--model-license", default="", metavar="LICENSE", help="licence of the weights, e.g. apache-2.0"
    )
    p.add_argument(
        "--include-tokens", action="store_true", help="copy the training token shards into OUT/tokens/"
    )
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--force", action="store_true", help="replace an earlier release in OUT")
    p.set_defaults(func=run)


def parse_licenses(items: list[str]) -> dict[str, str]:
    licenses = {}
    for item in items:
        source, sep, license_id = item.partition("=")
        if not sep or not source.strip() or not license_id.strip():
            raise UserError(f"--license {item!r} must be SOURCE=LICENSE, e.g. --license stdlib=PSF-2.0.")
        licenses[source.strip()] = license_id.strip()
    return licenses


def run(args: argparse.Namespace) -> int:
    from smelt.tables import print_table

    if args.verify is not None:
        if args.run or args.out:
            raise UserError(
                "`smelt release --verify OUT` takes only the release directory; drop RUN and OUT."
            )
        from smelt.release.verify import verify_release

        print_table(verify_release(args.verify))
        print(f"\nrelease {args.verify}: verified")
        return 0
    if not args.run or not args.out:
        raise UserError(
            "`smelt release` needs RUN and OUT (e.g. smelt release runs/quickstart release/), or --verify OUT."
        )
    from smelt.release.build import release_run

    release = release_run(
        args.run,
        args.out,
        every_checkpoint=args.all_checkpoints,
        licenses=parse_licenses(args.licenses),
        model_license=args.model_license,
        include_tokens=args.include_tokens,
        dtype=args.dtype,
        force=args.force,
    )
    rows = [(r["revision"], f"step {r['step']:,}, {r['tokens'] or 0:,} tokens") for r in release["revisions"]]
    rows.append(("files", f"{len(release['files'])} (sha256 in release.json)"))
    print_table(rows)
    if release["not_released"]:
        left = release["not_released"]
        which = (
            f"checkpoints of steps {', '.join(map(str, left))}"
            if len(left) > 1
            else f"checkpoint of step {left[0]}"
        )
        print(f"\nnot released (not milestones): the {which}; --all-checkpoints adds them")
    print(f"\nrelease: {args.out} (check it with `smelt release --verify {args.out}`)")
    return 0
