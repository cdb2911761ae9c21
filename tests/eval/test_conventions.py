"""Prompt conventions: lm-evaluation-harness's request encoding by default, one EOS first as an option,
the convention recorded in results, and a greedy gallery that `transformers` generate reproduces."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

from helpers import build_model, tiny_model_config
from smelt.errors import UserError
from smelt.eval.harness import prepare, prompt_ids, render, score_prepared
from smelt.eval.run import evaluate_checkpoints, gallery, plan_request
from smelt.eval.tasks import Task, TaskSpec, get_spec, load_task

CPU = torch.device("cpu")


def lm_eval_request(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """How lm-evaluation-harness 0.4 turns a loglikelihood request into tokens for a Hugging Face
    model (TemplateLM.loglikelihood and _encode_pair; HFLM adds no BOS by default): an empty context
    becomes the end-of-text token, otherwise trailing whitespace moves into the continuation and the
    continuation is the tokens of the whole text past the context's."""
    if context == "":
        return [tokenizer.eos_id], tokenizer.encode(continuation)
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation, context = context[-spaces:] + continuation, context[:-spaces]
    whole, ctx = tokenizer.encode(context + continuation), tokenizer.encode(context)
    return ctx, whole[len(ctx) :]


def requests(task: Task) -> list[tuple[str, str]]:
    """(context, continuation) texts of a zero-shot task, in the order prepare() keeps them."""
    out = []
    for record in task.records:
        prompts, conts, _ = render(task, record)
        out += list(zip(prompts, conts, strict=True))
    return out


@pytest.fixture(scope="module")
def tokenizer(tiny_run):
    from smelt.tokenizer.load import Tokenizer

    root, _ = tiny_run
    return Tokenizer.load(root / "tokenizer")


def tasks_under_test(tiny_run) -> list[Task]:
    root, _ = tiny_run
    tasks = [
        load_task(get_spec(name), root.parent / "tasks", shots=0)
        for name in ("copa", "winogrande", "lambada")
    ]
    # A template ending in a space (lm-eval moves it into the answer) and an empty context.
    spec = TaskSpec("spaced", "x.jsonl", "mosaic", "cloze", "Question: {query}\nAnswer: ")
    records = [
        {"id": 0, "query": "where did the cat sit?", "choices": ["on the mat.", "in the tree."], "gold": 0},
        {"id": 1, "query": "who laughed?", "choices": ["the children", "the dog"], "gold": 0},
    ]
    tasks.append(Task(spec, records, total=2))
    tasks.append(Task(TaskSpec("empty", "x.jsonl", "mosaic", "cloze"), [records[0] | {"query": ""}], total=1))
    return tasks


@pytest.mark.slow
def test_requests_are_tokenized_as_lm_eval_tokenizes_them(tiny_run, tokenizer):
    for task in tasks_under_test(tiny_run):
        prep = prepare(task, tokenizer, max_len=512)
        expected = [lm_eval_request(tokenizer, c, k) for c, k in requests(task)]
        assert prep.pairs == expected, task.spec.name
        assert prep.convention == "lm-eval"
        for (context, _), (ctx, _) in zip(requests(task), prep.pairs, strict=True):
            # No token is put before a context; only an empty one is scored after the end-of-text token.
            assert (ctx == [tokenizer.eos_id]) == (context == "")
    spaced = prepare(tasks_under_test(tiny_run)[3], tokenizer, 512)
    assert tokenizer.decode(spaced.pairs[0][1]) == "  on the mat."  # the template's space moved over


@pytest.mark.slow
def test_eos_convention_puts_one_eos_before_every_context(tiny_run, tokenizer):
    for task in tasks_under_test(tiny_run):
        prep = prepare(task, tokenizer, max_len=512, convention="eos")
        for (context, cont), (ctx, cont_ids) in zip(requests(task), prep.pairs, strict=True):
            assert ctx == [tokenizer.eos_id, *tokenizer.encode(context)]
            assert tokenizer.decode(cont_ids) == cont


def test_generation_prompts_follow_the_convention(tiny_run, tokenizer):
    root, _ = tiny_run
    task = load_task(get_spec("gsm8k"), root.parent / "tasks", shots=0)
    texts = [render(task, r)[0][0] for r in task.records]
    lm_eval = prepare(task, tokenizer, 512)
    eos = prepare(task, tokenizer, 512, convention="eos")
    assert lm_eval.prompts == [tokenizer.encode(t) for t in texts]
    assert eos.prompts == [[tokenizer.eos_id, *tokenizer.encode(t)] for t in texts]
    assert prompt_ids(tokenizer, "") == prompt_ids(tokenizer, "", "eos") == [tokenizer.eos_id]
    with pytest.raises(UserError, match=r"eval.convention = 'bos' is not one of lm-eval, eos"):
        prepare(task, tokenizer, 512, convention="bos")


@pytest.mark.slow
def test_the_convention_changes_scores_and_is_recorded(tiny_run, tokenizer, tmp_path):
    root, cfg = tiny_run
    task = load_task(get_spec("copa"), root.parent / "tasks", shots=0)
    model = build_model(tiny_model_config(max_seq_len=128), vocab=tokenizer.vocab_size)
    by_convention = {}
    for convention in ("lm-eval", "eos"):
        prep = prepare(task, tokenizer, 128, convention=convention)
        by_convention[convention] = score_prepared(model, tokenizer, prep, 4, CPU, details=True)
        assert by_convention[convention]["convention"] == convention
    logprobs = [d["logprobs"] for d in by_convention["lm-eval"]["details"]]
    assert logprobs != [d["logprobs"] for d in by_convention["eos"]["details"]]

    eos_cfg = copy.deepcopy(cfg)
    eos_cfg.eval.convention = "eos"
    keys = [plan_request(c, root, ["copa"], 0).keys for c in (cfg, eos_cfg)]
    assert keys[0]["tasks"]["copa"] != keys[1]["tasks"]["copa"] and keys[0]["samples"] != keys[1]["samples"]
    shutil.copytree(root, tmp_path / "run")
    (result,) = evaluate_checkpoints(cfg, tmp_path / "run", "2", tasks=["copa"], limit=4)
    step = json.loads((tmp_path / "run" / "eval" / "step_0000002.json").read_text())
    assert step["convention"] == result["convention"] == "lm-eval"
    assert step["tasks"]["copa"]["convention"] == "lm-eval"
    curve = json.loads((tmp_path / "run" / "eval" / "curves.jsonl").read_text().splitlines()[0])
    assert curve["convention"] == "lm-eval"


@pytest.mark.parametrize("convention", ["lm-eval", "eos"])
@pytest.mark.slow
def test_gallery_is_what_transformers_greedy_generate_continues(tiny_run, tokenizer, tmp_path, convention):
    transformers = pytest.importorskip("transformers")
    from smelt.model.generate import generate
    from smelt.model.hf import export_model

    root, _ = tiny_run
    model = build_model(tiny_model_config(max_seq_len=128), vocab=tokenizer.vocab_size, seed=3).eval()
    out = export_model(model, tmp_path / "hf", tokenizer_dir=root / "tokenizer", dtype=torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    prompts = ["The cat", "A dog ran to the", " the children laughed because"]
    steps = 16
    items = gallery(model, tokenizer, prompts, steps, convention)
    for prompt, item in zip(prompts, items, strict=True):
        inputs = hf_tok(prompt, return_tensors="pt")
        if convention == "eos":  # the documented way to feed the eos convention: one EOS first
            eos = torch.tensor([[hf_tok.eos_token_id]])
            inputs = {"input_ids": torch.cat([eos, inputs["input_ids"]], 1),
                      "attention_mask": torch.cat([torch.ones_like(eos), inputs["attention_mask"]], 1)}  # fmt: skip
        with torch.no_grad():
            hf_ids = hf.generate(**inputs, do_sample=False, max_new_tokens=steps)[0].tolist()
        ids = prompt_ids(tokenizer, prompt, convention)
        assert hf_ids[: len(ids)] == ids
        ours = generate(model, ids, steps, temperature=0.0, eos_id=tokenizer.eos_id)
        assert ours == hf_ids, prompt
        assert item["completion"] == tokenizer.decode(hf_ids[len(ids) :])


def test_in_loop_evaluation_follows_the_convention(tiny_run, tokenizer):
    from smelt.eval.inloop import InLoopEval

    _, cfg = tiny_run
    cfg = copy.deepcopy(cfg)
    cfg.eval.every_steps, cfg.eval.inloop_tasks, cfg.eval.inloop_items = 1, ["copa"], 4
    root, _ = tiny_run
    for convention in ("lm-eval", "eos"):
        cfg.eval.convention = convention
        prep = InLoopEval(cfg, root / "tokenizer", CPU).prepared["copa"]
        assert prep.convention == convention
        assert (prep.pairs[0][0][0] == tokenizer.eos_id) == (convention == "eos")
