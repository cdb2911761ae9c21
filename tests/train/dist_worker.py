"""Entry point for the 2-process tests: `torchrun --nproc_per_node 2 dist_worker.py CONFIG.json TOKENS TOKENIZER OUT [RESUME]`.

Every rank runs smelt.train.trainer.train with the config in the JSON file; rank 0 writes metrics.jsonl.
"""

import json
import sys
from pathlib import Path

from smelt.config import config_from_dict
from smelt.train.trainer import train

if __name__ == "__main__":
    config_path, tokens, tokenizer, out = sys.argv[1:5]
    resume = sys.argv[5] if len(sys.argv) > 5 else None
    config = config_from_dict(json.loads(Path(config_path).read_text()))
    summary = train(config, tokens, tokenizer, out, resume=resume)
    if summary["rank"] == 0:
        (Path(out) / "summary.json").write_text(json.dumps(summary))
