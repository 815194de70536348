"""Checkpoint export: a training checkpoint becomes a Hugging Face Llama directory.

Purpose: everything that serves or evaluates a model (vLLM, transformers, `factory serve`, the
eval suite) reads the same artifact — `config.json`, `model.safetensors`, `generation_config.json`
and the tokenizer files — so what is evaluated is exactly what would be deployed.

Design:
- The directory is content-addressed: `artifacts/exports/<run>@<step>-<sha12>/`, where the hash
  covers every file's bytes. It is written into a temp directory and renamed into place, so a
  crash leaves no half export, and re-exporting an unchanged checkpoint finds the same directory
  and records nothing new.
- The weights come from `llama_state_dict` (names are Llama's already; a muP head is folded and
  untied there), saved in fp32: the equivalence check compares at fp32 and a serving stack casts
  down itself.
- Lineage: one row `export/<run>@<step>` (kind `export`) whose upstream is the checkpoint and the
  tokenizer; the checkpoint row leads on to the mix version and its pinned snapshots.

Test seam: `FACTORY_FAULTS='{"corrupt_export": true}'` scales one weight matrix by 1.01 before it
is saved — a plausible exporter bug (a wrong transpose or scale) that the equivalence check must
catch and block.

Why not `save_pretrained` on a transformers model: building `LlamaForCausalLM` only to write its
weights doubles the memory of a large model and re-initialises weights we then overwrite.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict

from factory.experiments.spec import Plan
from factory.home import artifacts_dir, uri_to_path
from factory.lake.catalog import Lake
from factory.lake.lineage import LineageRecord
from factory.tokenize.bpe import SPECIAL_TOKENS
from factory.train import checkpoint as ckpt
from factory.train.model import Transformer, llama_config_dict, llama_state_dict
from factory.version import canonical_json, code_version, env_lock_hash
from factory import settings

FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class ExportError(ValueError):
    """A checkpoint cannot be exported or an export cannot be found; the message names it."""


class ExportRef(BaseModel):
    """One exported model directory and where it came from."""

    model_config = ConfigDict(frozen=True)

    export_id: str  # export/<run>@<step>
    checkpoint_id: str
    run: str
    step: int
    path: Path
    sha256: str
    tokenizer: str  # tokenizer version id
    mix_version: str

    @property
    def uri(self) -> str:
        return self.path.resolve().as_uri()


class TrainedCheckpoint(BaseModel):
    """A checkpoint row resolved to its file, plan and tokenizer."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    row: dict
    ref: ckpt.CheckpointRef
    plan: Plan
    tokenizer_path: str

    @property
    def checkpoint_id(self) -> str:
        return self.ref.checkpoint_id


def export_id_of(checkpoint_id: str) -> str:
    return "export/" + checkpoint_id.removeprefix("ckpt/")


def find_checkpoint(lake: Lake, checkpoint_id: str) -> TrainedCheckpoint:
    """The checkpoint `ckpt/<run>@<step>` (the `ckpt/` prefix may be left out), verified on disk."""
    from factory.tokenize import TokenizerError
    from factory.tokenize.bpe import tokenizer_artifact

    wanted = checkpoint_id if checkpoint_id.startswith("ckpt/") else f"ckpt/{checkpoint_id}"
    rows = [r for r in ckpt.checkpoints(lake) if r["checkpoint_id"] == wanted]
    if not rows:
        from factory.train.runs import closest

        known = [r["checkpoint_id"] for r in sorted(ckpt.checkpoints(lake), key=lambda r: r["created_at"])]
        raise ExportError(f"checkpoint {wanted}: not in train.checkpoints{closest(wanted, known)}")
    row = rows[-1]
    path = uri_to_path(row["uri"])
    problem = ckpt.validate(path)
    if problem:
        raise ExportError(f"checkpoint {wanted} ({path}): {problem}")
    ref = ckpt.CheckpointRef(run=row["run"], step=row["step"], path=path, sha256=row["sha256"], bytes=row["bytes"],
                             tokens=row["tokens"], loss=row["loss"], created_at=row["created_at"])
    payload = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    plan = Plan.load(payload["plan"])
    # the plan's own tokenizer: a fine-tune's (the chat version of its mix's) is not the mix's
    try:
        tokenizer_path = tokenizer_artifact(lake, plan.tokenizer).path
    except TokenizerError as e:
        raise ExportError(f"checkpoint {wanted}: {e}") from None
    return TrainedCheckpoint(row=row, ref=ref, plan=plan, tokenizer_path=tokenizer_path)


def training_model(checkpoint: TrainedCheckpoint) -> Transformer:
    """Our training model with the checkpoint's weights, in eval mode (the equivalence reference)."""
    payload = ckpt.load_checkpoint(checkpoint.ref)
    model = Transformer(checkpoint.plan.model)
    model.load_state_dict(payload["model"])
    return model.eval()


def export_checkpoint(lake: Lake, checkpoint: "str | TrainedCheckpoint", *, run_id: str = "",
                      asset_key: str = "checkpoint_export") -> ExportRef:
    """Export a checkpoint (its id, or one `find_checkpoint` already verified) to a content-addressed
    HF Llama directory and record its lineage."""
    if isinstance(checkpoint, str):
        checkpoint = find_checkpoint(lake, checkpoint)
    model = training_model(checkpoint)
    root = artifacts_dir(lake.home) / "exports"
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".export-"))
    try:
        _write(staging, model, checkpoint)
        digest = _digest(staging)
        final = root / f"{checkpoint.ref.run}@{checkpoint.ref.step}-{digest[:12]}"
        if final.exists():
            shutil.rmtree(staging)  # the same bytes are already there
        else:
            os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    export = ExportRef(export_id=export_id_of(checkpoint.checkpoint_id), checkpoint_id=checkpoint.checkpoint_id,
                       run=checkpoint.ref.run, step=checkpoint.ref.step, path=final, sha256=digest,
                       tokenizer=checkpoint.plan.tokenizer, mix_version=checkpoint.plan.mix_version)
    _record(lake, export, checkpoint, run_id=run_id, asset_key=asset_key)
    return export


def _write(directory: Path, model: Transformer, checkpoint: TrainedCheckpoint) -> None:
    from safetensors.torch import save_file
    from transformers import GenerationConfig, LlamaConfig

    ids = _special_ids(checkpoint.tokenizer_path)
    config = LlamaConfig(**llama_config_dict(model.config), architectures=["LlamaForCausalLM"],
                         bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"], dtype="float32")
    config.save_pretrained(directory)
    GenerationConfig(bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"]).save_pretrained(directory)
    state = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in llama_state_dict(model).items()}
    if settings.faults().corrupt_export:
        state["model.layers.0.mlp.down_proj.weight"] *= 1.01
    if config.tie_word_embeddings:
        state.pop("lm_head.weight")  # safetensors refuses shared storage; transformers re-ties on load
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    _write_tokenizer(directory, checkpoint.tokenizer_path, model.config.max_seq_len)
    (directory / "factory.json").write_text(canonical_json({
        "checkpoint_id": checkpoint.checkpoint_id, "checkpoint_sha256": checkpoint.ref.sha256,
        "mix_version": checkpoint.plan.mix_version, "tokenizer": checkpoint.plan.tokenizer,
        "seq_len": checkpoint.plan.seq_len, "experiment": checkpoint.plan.experiment.name,
    }))
    _share(directory)


def _write_tokenizer(directory: Path, tokenizer_path: str, max_seq_len: int) -> None:
    """Our tokenizer.json as it is, and a tokenizer_config.json that transformers 4.x and 5.x both read.

    Why not `PreTrainedTokenizerFast.save_pretrained`: 5.x writes `tokenizer_class: TokenizersBackend`
    and the extra special tokens as a list under `extra_special_tokens`, which 4.x cannot load
    ("Tokenizer class TokenizersBackend does not exist"). `PreTrainedTokenizerFast` is a class in 4.x
    and an alias of the tokenizers backend in 5.x, and 5.x still reads `additional_special_tokens`.
    Copying the file keeps the export's bytes (and so its hash) independent of the transformers version.
    """
    from factory.tokenize import load_tokenizer
    from factory.tokenize.chat import CHAT_TEMPLATE, ROLES, is_chat_tokenizer

    shutil.copyfile(Path(tokenizer_path) / "tokenizer.json", directory / "tokenizer.json")
    extra = [SPECIAL_TOKENS[k] for k in ("fim_prefix", "fim_middle", "fim_suffix")]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS["bos"], "eos_token": SPECIAL_TOKENS["eos"], "pad_token": SPECIAL_TOKENS["pad"],
        "additional_special_tokens": extra,
        "model_max_length": max_seq_len,
        "clean_up_tokenization_spaces": False,  # decode(encode(x)) == x: a byte-level BPE needs no cleanup
    }
    if is_chat_tokenizer(load_tokenizer(tokenizer_path)):
        # a fine-tuned chat model: the template transformers' apply_chat_template and vLLM's
        # /v1/chat/completions render (factory.tokenize.chat)
        config["additional_special_tokens"] = extra + list(ROLES.values())
        config["chat_template"] = CHAT_TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _share(directory: Path) -> None:
    """Directories 0755, files 0644: an export is read by other accounts (a serving user, a shared
    eval box), whatever the umask, `mkdtemp` (0700) or safetensors (0600) gave them."""
    directory.chmod(0o755)
    for path in directory.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _special_ids(tokenizer_path: str) -> dict[str, int]:
    from factory.tokenize import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)
    ids = {role: tokenizer.token_to_id(token) for role, token in SPECIAL_TOKENS.items()}
    missing = [role for role, i in ids.items() if i is None]
    if missing:
        raise ExportError(f"tokenizer {tokenizer_path}: no special token for {missing}")
    return ids


def _digest(directory: Path) -> str:
    """sha256 over (name, sha256 of bytes) of every file, in name order."""
    outer = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        outer.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return outer.hexdigest()


def _record(lake: Lake, export: ExportRef, checkpoint: TrainedCheckpoint, *, run_id: str, asset_key: str) -> None:
    known = lake.lineage.records(version_id=export.export_id)
    if known and known[-1].content_hash == export.sha256:
        return
    lake.lineage.record(LineageRecord(
        version_id=export.export_id, kind="export", name=f"export/{export.run}", uri=export.uri,
        content_hash=export.sha256, upstream=[checkpoint.checkpoint_id, checkpoint.plan.tokenizer],
        config_json=canonical_json({"format": "hf-llama", "dtype": "float32"}), config_hash=checkpoint.plan.config_hash,
        code_version=code_version(), env_lock=env_lock_hash(), asset_key=asset_key, partition=export.export_id,
        run_id=run_id, metadata_json=canonical_json({"step": export.step, "files": sorted(FILES)}),
    ))


def find_export(lake: Lake, ref: str) -> ExportRef:
    """An export by id (`export/<run>@<step>`), checkpoint id, or directory path."""
    path = uri_to_path(ref)
    if path.is_dir():
        meta_file = path / "factory.json"
        if not (path / "config.json").exists() or not meta_file.exists():
            raise ExportError(f"{path}: not a factory export (config.json or factory.json missing)")
        meta = json.loads(meta_file.read_text())
        run, step = meta["checkpoint_id"].removeprefix("ckpt/").rsplit("@", 1)
        return ExportRef(export_id=export_id_of(meta["checkpoint_id"]), checkpoint_id=meta["checkpoint_id"], run=run,
                         step=int(step), path=path, sha256=_digest(path), tokenizer=meta["tokenizer"],
                         mix_version=meta["mix_version"])
    wanted = export_id_of(ref) if ref.startswith("ckpt/") else ref if ref.startswith("export/") else f"export/{ref}"
    records = lake.lineage.records(kind="export", version_id=wanted)
    if not records:
        raise ExportError(f"export {wanted}: not found in lineage (export its checkpoint first: "
                          f"`factory export {wanted.removeprefix('export/')}`)")
    directory = uri_to_path(records[-1].uri or "")
    if not directory.is_dir():
        raise ExportError(f"export {wanted}: its directory {directory} is gone (re-export the checkpoint)")
    found = find_export(lake, str(directory))
    if found.sha256 != records[-1].content_hash:
        raise ExportError(f"export {wanted} at {found.path}: files changed since export "
                          f"(sha256 {found.sha256[:12]}, lineage says {records[-1].content_hash[:12]})")
    return found


def latest_export(lake: Lake) -> ExportRef:
    """The newest export recorded in lineage (what generators use by default)."""
    records = lake.lineage.records(kind="export")
    if not records:
        raise ExportError("no export in the lake yet: export a checkpoint first (`factory export <run>@<step>`)")
    return find_export(lake, records[-1].version_id)
