"""`smelt posttrain run ...` that dies as a kill would once step N's train record is written:
`[torchrun ...] killed_posttrain.py N posttrain run CONFIG --set ...`.

The process leaves with os._exit(137), which skips every cleanup as SIGKILL does: the run keeps its
committed checkpoints, the records written since the last one, and no summary.
"""

import os
import sys

from smelt.cli import main
from smelt.posttrain.stage import Stage

if __name__ == "__main__":
    kill_after, argv = int(sys.argv[1]), sys.argv[2:]
    real_log = Stage.log_record

    def log_record(self: Stage, record: dict) -> None:
        real_log(self, record)
        if record.get("kind") == "train" and record.get("step") == kill_after:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(137)

    Stage.log_record = log_record  # type: ignore[method-assign]
    sys.exit(main(argv))
