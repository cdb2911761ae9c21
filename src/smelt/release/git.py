"""Revisions as git branches, as model hubs keep intermediate checkpoints: when OUT is a git
repository, each revision folder becomes a branch `step_NNNNNNN` whose tree is that checkpoint's
Hugging Face files at the top, each branch's commit the child of the previous revision's (so
`git log step_0001000` lists the checkpoints before it). The branches are written with a private index
file, so the repository's own index, HEAD and working tree are not touched; the top-level files (the
final model, cards, data order, logs) stay in the working tree for the user to commit (with git-lfs
for the weights if the hub asks for it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from smelt.errors import UserError

IDENTITY = {"GIT_AUTHOR_NAME": "smelt", "GIT_AUTHOR_EMAIL": "smelt@localhost"}


def _git(repo: Path, *args: str, env: dict[str, str] | None = None, work_tree: Path | None = None) -> str:
    command = ["git", f"--git-dir={repo.resolve() / '.git'}"]
    if work_tree is not None:
        command.append(f"--work-tree={work_tree}")
    done = subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, check=False, cwd=work_tree or repo
    )
    if done.returncode:
        raise UserError(f"git {' '.join(args[:2])} failed in {repo}: {done.stderr.strip()}")
    return done.stdout.strip()


def _has_identity(repo: Path) -> bool:
    done = subprocess.run(
        ["git", f"--git-dir={repo / '.git'}", "config", "user.email"],
        capture_output=True,
        text=True,
        check=False,
    )
    return bool(done.stdout.strip())


def commit_revisions(out_dir: Path, revisions: list[str], folder: str = "revisions") -> list[str]:
    """Commit each OUT/<folder>/<revision> as branch <revision>, then remove the folders. Returns the commits."""
    commits: list[str] = []
    parent: str | None = None
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        if not _has_identity(out_dir):
            env.update(IDENTITY)
            env.update(
                {
                    "GIT_COMMITTER_NAME": IDENTITY["GIT_AUTHOR_NAME"],
                    "GIT_COMMITTER_EMAIL": IDENTITY["GIT_AUTHOR_EMAIL"],
                }
            )
        for revision in revisions:
            tree_dir = out_dir / folder / revision
            _git(out_dir, "read-tree", "--empty", env=env)
            _git(out_dir, "add", "--all", ".", env=env, work_tree=tree_dir)
            tree = _git(out_dir, "write-tree", env=env)
            args = [
                "commit-tree",
                tree,
                "-m",
                f"{revision}: Hugging Face files of the checkpoint of this step",
            ]
            if parent is not None:
                args += ["-p", parent]
            parent = _git(out_dir, *args, env=env)
            _git(out_dir, "update-ref", f"refs/heads/{revision}", parent, env=env)
            commits.append(parent)
    shutil.rmtree(out_dir / folder)
    return commits


def extract_revision(out_dir: Path, revision: str, target: Path) -> Path:
    """The files of branch `revision` written into `target` (for verification)."""
    target.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", f"--git-dir={out_dir / '.git'}", "archive", "--format=tar", revision],
        capture_output=True,
        check=False,
    )
    if archive.returncode:
        raise UserError(
            f"git branch {revision} of {out_dir} cannot be read ({archive.stderr.decode().strip()}); the release's "
            f"revisions are missing from the repository."
        )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target
