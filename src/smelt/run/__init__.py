"""Running a run directory's stages: the table of stages (`stages.py`), running them in order and
skipping those up to date (`pipeline.py`), what a config change means for work already done, one
writer per stage and moving superseded work aside (`lifecycle.py`), the end-of-run summary
(`summary.py`) and anneal forks (`anneal.py`)."""
