"""`smelt CMD ...` that dies as a kill would after optimizer step N, on every rank:
`[torchrun --nproc_per_node W] killed_cli.py N train CONFIG --set ...`.

After step N's records and checkpoint (if one was due) each process leaves with os._exit(137), which
skips every cleanup, as SIGKILL does: the stage keeps its attempt record, its committed checkpoints and
no manifest, and the next `smelt train` of the same config resumes it.
"""

import os
import sys

from smelt.cli import main
from smelt.train.ops.watchdog import Watchdog

if __name__ == "__main__":
    kill_after, argv = int(sys.argv[1]), sys.argv[2:]
    real_beat = Watchdog.beat

    def beat(self: Watchdog, step: int) -> None:
        real_beat(self, step)
        if step == kill_after:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(137)

    Watchdog.beat = beat  # type: ignore[method-assign]
    sys.exit(main(argv))
