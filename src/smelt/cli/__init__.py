"""The `smelt` command: it assembles the commands of every package and dispatches to them.

Each package that owns commands exposes `add_parsers(subparsers)` in its `commands` module; every
parser it adds names its handler with `set_defaults(func=...)`, which takes the parsed arguments and
returns an exit code. A module may also expose `verb_parsers()` for a verb argparse cannot nest beside
a positional argument (`curate quality-train CONFIG` beside `curate CONFIG`). Building the parser
imports no torch: handlers import what they need when they run.

Exit codes: 0 done, 1 failed while running, 2 bad input (config, paths, data) with a message that
names the offending key, file or record and how to fix it, 3 a training run that stopped itself in a
way a restart would repeat (an alert's "stop", too many skipped steps, non-finite weights), 75 a
training run stopped by SIGTERM or SIGINT after committing a checkpoint (run the command again to go
on), 124 the watchdog (train/ops/watchdog.py), 130 interrupted elsewhere. A rank of torchrun, or the
child of `smelt train --max-restarts`, ends when its launcher does (watchdog.die_with_parent).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import time
import traceback
from collections.abc import Iterator, Sequence

from smelt.cli.pipeline import QUICKSTART_CONFIG
from smelt.errors import UserError
from smelt.progress import launch_rank
from smelt.train.ops.watchdog import STOPPED_EXIT_CODE, StopRequested, die_with_parent, launched

# In the order `smelt --help` lists their commands.
COMMAND_MODULES = (
    "smelt.cli.pipeline",
    "smelt.cli.data",
    "smelt.cli.tokenizer",
    "smelt.cli.tokens",
    "smelt.cli.train",
    "smelt.cli.spikes",
    "smelt.cli.checkpoint",
    "smelt.cli.inspection",
    "smelt.cli.plan",
    "smelt.cli.report",
    "smelt.cli.eval",
    "smelt.cli.posttrain",
    "smelt.cli.release",
)
RANK_0_GRACE_S = 10.0  # how long other ranks wait for rank 0 to report bad input (see _wait_for_rank_0)

__all__ = ["COMMAND_MODULES", "QUICKSTART_CONFIG", "build_parser", "command_parsers", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="smelt",
        description="From raw text to a trained and evaluated language model, reproducibly.",
    )
    parser.add_argument("--version", action="version", version=f"smelt {_version()}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="also print the traceback of a failure whose message says it all (a full disk, a run that "
        "stopped itself); SMELT_DEBUG=1 does the same",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parsers(subparsers)
    return parser


def verb_parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """The verbs parsed outside the subcommand tree, by their words, from every command module."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        if hasattr(module, "verb_parsers"):
            found.update(module.verb_parsers())
    return found


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command that runs something, by its words ("checkpoint verify"), with its parser: the
    leaves of the subcommand tree plus the verbs parsed outside it. The README's table of which
    commands take `--set` and `--force` is checked against this."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if words and not subs:
            found[" ".join(words)] = parser
        for action in subs:
            for name, child in action.choices.items():
                walk(child, (*words, name))

    walk(build_parser(), ())
    found.update({" ".join(words): parser for words, parser in verb_parsers().items()})
    return found


def _version() -> str:
    from smelt import __version__

    return __version__


def _parse(argv: list[str]) -> argparse.Namespace:
    for words, parser in verb_parsers().items():
        if tuple(argv[: len(words)]) == words:
            return parser.parse_args(argv[len(words) :])
    return build_parser().parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = argv[:1] == ["--debug"] or os.environ.get("SMELT_DEBUG", "") not in ("", "0")
    argv = argv[1:] if argv[:1] == ["--debug"] else argv  # before the verbs parsed outside the tree
    if launched():  # a rank of torchrun or a supervised child: no orphan that trains on alone
        die_with_parent()
    rank = launch_rank()
    # Under torchrun every rank runs this same command. Rank 0 prints the tables and summaries; the
    # other ranks' stdout would only repeat them (with their own timings), so it goes nowhere, and so
    # do their copies of a usage error.
    with _unless_rank_0(rank, contextlib.redirect_stdout):
        try:
            with _unless_rank_0(rank, contextlib.redirect_stderr):
                args = _parse(argv)
        except SystemExit as exc:
            if rank and exc.code not in (0, None):  # a usage error: rank 0 says it
                _wait_for_rank_0()
            raise
        try:
            _one_process_unless_train(args)
            return _dispatch(args)
        except UserError as exc:
            if _reports_bad_input(rank):
                tag = f"[rank {rank}] " if rank else ""
                print(f"smelt: {tag}error: {exc}", file=sys.stderr)
            else:
                _wait_for_rank_0()
                # Still running: rank 0 did not stop on this input, so this rank found a problem of its own.
                print(f"smelt: [rank {rank}] error: {exc}", file=sys.stderr)
            return 2
        except StopRequested as exc:  # SIGTERM or SIGINT while training: the checkpoint is committed
            if rank == 0:
                print(f"smelt: {exc}", file=sys.stderr)
            return exc.exit_code
        except KeyboardInterrupt:
            if rank == 0:
                print("smelt: interrupted", file=sys.stderr)
            return 130
        except Exception as exc:
            if debug and (_stopped_itself(exc) or _says_it_all(exc)):
                traceback.print_exc()
            if _stopped_itself(exc):
                if rank == 0:
                    print(
                        f"smelt: {exc} (exit {STOPPED_EXIT_CODE}: the run stopped itself, and a restart from its "
                        f"last checkpoint would replay the same data to the same stop, so --max-restarts does "
                        f"not relaunch it.)",
                        file=sys.stderr,
                    )
                return STOPPED_EXIT_CODE
            if _says_it_all(exc):  # what happened, what is intact and what to do: no traceback needed
                tag = f"[rank {rank}] " if rank else ""
                print(f"smelt: {tag}{exc}\nsmelt: {tag}failed while running (exit 1); `smelt --debug ...` "
                      f"shows the traceback.", file=sys.stderr)  # fmt: skip
                return 1
            # A failure while running: show everything, it is a bug or an environment problem.
            text = (
                traceback.format_exc()
                + "smelt: failed while running (exit 1); the traceback above says where."
            )
            if rank:  # ranks fail on their own (a device, a file, a collective): say which one it was
                text = "\n".join(f"[rank {rank}] {line}" for line in text.splitlines())
            print(text, file=sys.stderr)
            return 1


def _stopped_itself(exc: Exception) -> bool:
    """Whether `exc` is a training run's deliberate stop (train/alerts.py's TrainingStopped). Read
    from the loaded modules: only a run that imported alerts.py can raise it, and a failure of any
    other command should not import torch just to find out."""
    alerts = sys.modules.get("smelt.train.alerts")
    return alerts is not None and isinstance(exc, alerts.TrainingStopped)


def _says_it_all(exc: Exception) -> bool:
    """Whether `exc` is an expected failure whose message is complete: a checkpoint that could not be
    written (checkpoint/failures.py's CheckpointSaveError, a full disk). Read from the loaded modules,
    like _stopped_itself."""
    failures = sys.modules.get("smelt.checkpoint.failures")
    return failures is not None and isinstance(exc, failures.CheckpointSaveError)


def _wait_for_rank_0() -> None:
    """Give rank 0 time to report the bad input every rank found. torchrun stops all ranks as soon as
    one exits, so a rank that exited at once could stop rank 0 before it has said anything; once rank 0
    has exited, torchrun ends this one."""
    time.sleep(RANK_0_GRACE_S)


@contextlib.contextmanager
def _unless_rank_0(rank: int, redirect) -> Iterator[None]:
    """`redirect` (redirect_stdout or redirect_stderr) to the null device on ranks other than 0."""
    if rank == 0:
        yield
        return
    with open(os.devnull, "w") as sink, redirect(sink):
        yield


def _one_process_unless_train(args: argparse.Namespace) -> None:
    """Under torchrun every rank would run the command in full: N copies of curate writing one
    directory, N evaluations of one checkpoint. Only `smelt train` and `smelt posttrain run` divide
    their work among ranks."""
    world = os.environ.get("WORLD_SIZE", "1")
    posttrain_run = args.command == "posttrain" and getattr(args, "posttrain_command", None) == "run"
    if args.command == "train" or posttrain_run or world in ("", "0", "1"):
        return
    command = "curate quality-train" if args.command == "curate-quality-train" else args.command
    raise UserError(
        f"`smelt {command}` runs in one process, but it was started as one of {world} (WORLD_SIZE = {world}, "
        f"set by torchrun). Only `smelt train` and `smelt posttrain run` run on several processes. Run "
        f"`smelt {command} ...` without torchrun (curate and tokenize have their own worker pools, data.workers and tokens.workers), then "
        f"`torchrun --nproc-per-node N -m smelt.cli train CONFIG`; see docs/distributed.md."
    )


def _reports_bad_input(rank: int) -> bool:
    """Whether this rank prints a bad-input error. Every rank reads the same config and finds the same
    mistake, so rank 0 reports it; on a node other than rank 0's the files may differ (a data path
    missing there), so that node's first process reports what it found, too."""
    if rank == 0:
        return True
    local_rank, node = os.environ.get("LOCAL_RANK", "0"), os.environ.get("GROUP_RANK", "0")
    return local_rank == "0" and node != "0"


def _dispatch(args: argparse.Namespace) -> int:
    return args.func(args)
