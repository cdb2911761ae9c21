"""Hugging Face interop: export a smelt model to a `transformers` folder, import a Llama folder back.

smelt's blocks are exactly Llama's (pre-norm RMSNorm, GQA, RoPE, SwiGLU, no biases), so a model
without QK-norm exports as `LlamaForCausalLM`. With QK-norm it exports as `Qwen3ForCausalLM`, the
Llama-shaped architecture whose per-head RMSNorm on queries and keys (before RoPE) is smelt's.
(OLMo 2 has QK-norm too but normalises over all heads at once and puts its norms after each
sublayer, so it is not the same function.) Partial rotary and NoPE layers exist in no Llama-shaped
`transformers` class, so such models are refused.

RoPE layout: smelt rotates interleaved pairs (x[2i], x[2i+1]); `transformers` rotates halves
(x[i], x[i + hd/2]) with the same frequency for i. Permuting each head's rows of wq and wk (and the
QK-norm gains) from [0, 2, 4, ..., 1, 3, 5, ...] turns one into the other; q . k is unchanged
because both sides move together.

`transformers` is needed only to load the result, not to write it: export writes config.json,
model.safetensors (in the checkpoint's dtype unless told otherwise) and the tokenizer files with
the plain `safetensors` package.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from smelt.config import ModelConfig
from smelt.config.moe import is_moe_layer
from smelt.errors import UserError
from smelt.layout import TOKENIZER_INFO, TOKENIZER_JSON
from smelt.model.flops import head_dim_of, resolved_d_ff
from smelt.model.hf_moe import ARCHITECTURES as MOE_ARCHITECTURES
from smelt.model.hf_moe import (
    MOE_TYPES,
    check_no_selection_bias,
    export_moe_layer,
    import_moe_layer,
    moe_config_from_hf,
    moe_hf_fields,
    moe_model_type,
)
from smelt.model.moe import MoE
from smelt.model.rope import hf_rope_fields, rope_from_hf
from smelt.model.transformer import Transformer

SAFETENSORS = "model.safetensors"


def _half_perm(head_dim: int) -> torch.Tensor:
    """Index taking interleaved pair order to rotate-half order within one head."""
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def _to_halves(weight: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """Rows of a q/k projection [n_heads * hd, d] (or a gain [hd]) reordered for rotate-half RoPE."""
    perm = _half_perm(head_dim)
    if weight.ndim == 1:
        return weight[perm].contiguous()
    return weight.view(n_heads, head_dim, -1)[:, perm].reshape(n_heads * head_dim, -1).contiguous()


def _to_pairs(weight: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    inverse = torch.argsort(_half_perm(head_dim))
    if weight.ndim == 1:
        return weight[inverse].contiguous()
    return weight.view(n_heads, head_dim, -1)[:, inverse].reshape(n_heads * head_dim, -1).contiguous()


def check_exportable(cfg: ModelConfig) -> str:
    """The `transformers` model_type this config exports as ("llama", "qwen3"; MoE: "qwen3_moe",
    "mixtral"); UserError if none."""
    if cfg.rope_fraction < 1.0 or cfg.nope_every:
        raise UserError(
            f"cannot export to Hugging Face: model.rope_fraction = {cfg.rope_fraction} and model.nope_every = "
            f"{cfg.nope_every} (partial rotary / NoPE layers) have no equivalent in the Llama-shaped "
            f"transformers classes (Llama, Qwen3), so the exported model would compute different logits. "
            f"Export works for models trained with rope_fraction = 1 and nope_every = 0."
        )
    if cfg.mlp != "swiglu" or cfg.value_embeddings:
        raise UserError(
            f"cannot export to Hugging Face: model.mlp = {cfg.mlp!r} and model.value_embeddings = "
            f"{str(cfg.value_embeddings).lower()} (ReLU² MLP / value embeddings) have no equivalent in the "
            f"Llama-shaped transformers classes (Llama, Qwen3), so the exported model would compute different "
            f"logits. Export works for models trained with mlp = 'swiglu' and value_embeddings = false."
        )
    if cfg.moe_experts:
        return moe_model_type(cfg)
    return "qwen3" if cfg.qk_norm else "llama"


def hf_config(
    cfg: ModelConfig, vocab_size: int, dtype: torch.dtype, special: dict[str, int] | None = None
) -> dict:
    """config.json for LlamaForCausalLM (or Qwen3ForCausalLM with QK-norm)."""
    model_type = check_exportable(cfg)
    head_dim = head_dim_of(cfg)
    config: dict[str, Any] = {
        "architectures": [
            {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM", **MOE_ARCHITECTURES}[model_type]
        ],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": resolved_d_ff(cfg),
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads or cfg.n_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        **hf_rope_fields(cfg, head_dim),
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "use_cache": True,
    }
    if model_type == "llama":
        config.update({"mlp_bias": False, "pretraining_tp": 1})
    elif model_type in MOE_TYPES:
        config.update(moe_hf_fields(cfg, model_type, cfg.moe_d_ff or resolved_d_ff(cfg)))
        if model_type == "qwen3_moe":
            config.update(
                {"use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layers}
            )
    else:
        config.update(
            {"use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layers}
        )
    for key, value in (special or {}).items():
        config[f"{key}_token_id"] = value
    return config


def hf_state_dict(model: Transformer, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """smelt parameters under `transformers` Llama/Qwen3 names, q/k rows in rotate-half order."""
    cfg = model.cfg
    model_type = check_exportable(cfg)
    n_heads, n_kv = cfg.n_heads, cfg.n_kv_heads or cfg.n_heads
    head_dim = head_dim_of(cfg)

    def t(x: torch.Tensor) -> torch.Tensor:
        x = x.detach().cpu()
        return (x.to(dtype) if dtype is not None else x).contiguous()

    out = {"model.embed_tokens.weight": t(model.tok_emb.weight), "model.norm.weight": t(model.norm.weight)}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = t(model.lm_head.weight)
    for i, block in enumerate(model.blocks):
        p, a = f"model.layers.{i}.", block.attn
        out[p + "input_layernorm.weight"] = t(block.attn_norm.weight)
        out[p + "post_attention_layernorm.weight"] = t(block.mlp_norm.weight)
        out[p + "self_attn.q_proj.weight"] = t(_to_halves(a.wq.weight.detach(), n_heads, head_dim))
        out[p + "self_attn.k_proj.weight"] = t(_to_halves(a.wk.weight.detach(), n_kv, head_dim))
        out[p + "self_attn.v_proj.weight"] = t(a.wv.weight)
        out[p + "self_attn.o_proj.weight"] = t(a.wo.weight)
        if a.q_norm is not None:
            out[p + "self_attn.q_norm.weight"] = t(_to_halves(a.q_norm.weight.detach(), n_heads, head_dim))
            out[p + "self_attn.k_norm.weight"] = t(_to_halves(a.k_norm.weight.detach(), n_kv, head_dim))
        if isinstance(block.mlp, MoE):
            out.update(export_moe_layer(block.mlp, model_type, p, t))
            continue
        out[p + "mlp.gate_proj.weight"] = t(block.mlp.gate.weight)
        out[p + "mlp.up_proj.weight"] = t(block.mlp.up.weight)
        out[p + "mlp.down_proj.weight"] = t(block.mlp.down.weight)
    return out


def _tokenizer_files(tokenizer_dir: Path, out_dir: Path, max_len: int) -> dict[str, int]:
    """Copy tokenizer.json; write tokenizer_config.json and special_tokens_map.json. Returns special ids."""
    import tokenizers

    tok_json, info_json = tokenizer_dir / TOKENIZER_JSON, tokenizer_dir / TOKENIZER_INFO
    for path in (tok_json, info_json):
        if not path.is_file():
            raise UserError(
                f"cannot export the tokenizer: {path} is missing. Point at the run's tokenizer directory "
                f"(run `smelt tokenizer train CONFIG` first)."
            )
    info = json.loads(info_json.read_text(encoding="utf-8"))
    inner = tokenizers.Tokenizer.from_file(str(tok_json))
    shutil.copyfile(tok_json, out_dir / TOKENIZER_JSON)
    ids = {name: int(info[f"{name}_id"]) for name in ("bos", "eos", "pad")}
    names = {name: inner.id_to_token(i) for name, i in ids.items()}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": names["bos"],
        "eos_token": names["eos"],
        "pad_token": names["pad"],
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        # smelt's tokenizer.json adds no special tokens itself; a document starts after an EOS.
        "add_bos_token": False,
        "add_eos_token": False,
        # Without this, PreTrainedTokenizerFast also returns token_type_ids, which Llama's generate
        # refuses: `model.generate(**tokenizer(text, return_tensors="pt"))` must just work.
        "model_input_names": ["input_ids", "attention_mask"],
    }
    from smelt.chat_template import (
        chat_template_fields,  # the chat format, as apply_chat_template reads it
    )

    tokenizer_config.update(chat_template_fields(info))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n"
    )
    special_map = {f"{name}_token": token for name, token in names.items()}
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps(special_map, indent=2, ensure_ascii=False) + "\n"
    )
    return ids


def _umask() -> int:
    """The process's file-creation mask (read by setting it, so set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def export_model(
    model: Transformer,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a `transformers` folder for `model` (+ tokenizer files when tokenizer_dir is given)."""
    from safetensors.torch import save_file

    check_exportable(model.cfg)
    check_no_selection_bias(model)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = dtype or model.tok_emb.weight.dtype
    special = None
    if tokenizer_dir is not None:
        special = _tokenizer_files(Path(tokenizer_dir), out_dir, model.cfg.max_seq_len)
    config = hf_config(model.cfg, model.vocab_size, dtype, special)
    save_file(hf_state_dict(model, dtype), str(out_dir / SAFETENSORS), metadata={"format": "pt"})
    # safetensors creates its file owner-only (0600); give it the mode every other file here gets.
    os.chmod(out_dir / SAFETENSORS, 0o666 & ~_umask())
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if special is not None:
        generation = {
            "bos_token_id": special["bos"],
            "eos_token_id": special["eos"],
            "pad_token_id": special["pad"],
        }
        (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out_dir


# ---------------------------------------------------------------------------------------------
# Import


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / SAFETENSORS).is_file():
        files = [SAFETENSORS]
    else:
        raise UserError(f"no model.safetensors (or model.safetensors.index.json) in {folder}.")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(folder / name)))
    return state


def config_from_hf(config: dict[str, Any], where: str = "config.json") -> ModelConfig:
    """The ModelConfig of a `transformers` Llama (or Qwen3) config; UserError for what smelt lacks."""
    model_type = config.get("model_type")
    if model_type not in ("llama", "qwen3", *MOE_TYPES):
        raise UserError(
            f"{where}: model_type {model_type!r} cannot be imported; smelt reads llama, qwen3, qwen3_moe "
            f"and mixtral."
        )
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" not in config:
        # transformers 5 saves RoPE as rope_parameters {"rope_type", "rope_theta", scaling keys}; 4.x
        # as top-level rope_theta and rope_scaling (with the same scaling keys), which is what smelt reads.
        scaling = rope if rope.get("rope_type", "default") != "default" else None
        config = {**config, "rope_theta": rope.get("rope_theta", 10_000.0), "rope_scaling": scaling}
    problems = []
    head_dim = int(config.get("head_dim") or hidden // heads)
    if config.get("attention_bias") or config.get("mlp_bias"):
        problems.append("attention or MLP biases")
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {config['hidden_act']!r}")
    if model_type in ("qwen3", "qwen3_moe") and config.get("use_sliding_window"):
        problems.append("sliding-window attention")
    if problems:
        raise UserError(f"{where}: cannot import into smelt's Llama architecture: {'; '.join(problems)}.")
    return ModelConfig(
        d_model=hidden,
        n_layers=int(config["num_hidden_layers"]),
        n_heads=heads,
        n_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=0 if head_dim == hidden // heads and hidden % heads == 0 else head_dim,
        d_ff=0 if model_type == "mixtral" else int(config["intermediate_size"]),
        **rope_from_hf(config, where),
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        init_std=float(config.get("initializer_range", 0.02)),
        max_seq_len=int(config.get("max_position_embeddings", 2048)),
        **(moe_config_from_hf(config, model_type, where) if model_type in MOE_TYPES else {}),
    )


def import_hf(folder: str | Path) -> Transformer:
    """Load a `transformers` Llama / Qwen3 folder (config.json + safetensors) as a smelt Transformer (fp32)."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise UserError(f"{folder} has no config.json; point at a Hugging Face model folder.")
    config = json.loads(config_path.read_text())
    cfg = config_from_hf(config, str(config_path))
    model_type = config["model_type"]
    vocab = int(config["vocab_size"])
    hf = _read_safetensors(folder)
    n_heads, n_kv, head_dim = cfg.n_heads, cfg.n_kv_heads, head_dim_of(cfg)
    state: dict[str, torch.Tensor] = {
        "tok_emb.weight": hf["model.embed_tokens.weight"],
        "norm.weight": hf["model.norm.weight"],
        "lm_head.weight": hf.get("lm_head.weight", hf["model.embed_tokens.weight"]),
    }
    for i in range(cfg.n_layers):
        p, s = f"model.layers.{i}.", f"blocks.{i}."
        state[s + "attn_norm.weight"] = hf[p + "input_layernorm.weight"]
        state[s + "mlp_norm.weight"] = hf[p + "post_attention_layernorm.weight"]
        state[s + "attn.wq.weight"] = _to_pairs(hf[p + "self_attn.q_proj.weight"], n_heads, head_dim)
        state[s + "attn.wk.weight"] = _to_pairs(hf[p + "self_attn.k_proj.weight"], n_kv, head_dim)
        state[s + "attn.wv.weight"] = hf[p + "self_attn.v_proj.weight"]
        state[s + "attn.wo.weight"] = hf[p + "self_attn.o_proj.weight"]
        if cfg.qk_norm:
            state[s + "attn.q_norm.weight"] = _to_pairs(hf[p + "self_attn.q_norm.weight"], n_heads, head_dim)
            state[s + "attn.k_norm.weight"] = _to_pairs(hf[p + "self_attn.k_norm.weight"], n_kv, head_dim)
        if is_moe_layer(cfg, i):
            state.update(import_moe_layer(hf, model_type, p, s + "mlp.", cfg.moe_experts))
            continue
        state[s + "mlp.gate.weight"] = hf[p + "mlp.gate_proj.weight"]
        state[s + "mlp.up.weight"] = hf[p + "mlp.up_proj.weight"]
        state[s + "mlp.down.weight"] = hf[p + "mlp.down_proj.weight"]
    model = Transformer.for_loading(cfg, vocab)  # no random init under weights about to be overwritten
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise UserError(
            f"{folder}: weights do not match the config (missing {missing}, unexpected {unexpected})."
        )
    return model.eval()
