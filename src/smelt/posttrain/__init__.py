"""Post-training: chat format and template, SFT, preference optimisation (DPO, SimPO) and RL with
verifiable rewards (GRPO), each a stage that starts from a committed smelt checkpoint and writes a new
run directory that the next stage (or `smelt eval`, `smelt export hf`) can start from."""
