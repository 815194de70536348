"""The chat format: role tokens, the template that transformers and vLLM render, and the encoder the
fine-tuning loss uses.

A conversation is `<|bos|>` then, per message, `<|role|>` + content + `<|eos|>`; a generation prompt
ends with `<|assistant|>`. Role tokens are special tokens added to the pre-training tokenizer (a new
tokenizer version, `tokenizer/<base>-chat@<hash>`, whose lineage parent is the base), so no text can
spell them and every content segment is tokenized alone: the tokenizer splits on special tokens first,
which makes `encode_chat`'s ids exactly those of tokenizing the rendered template, whether by
`PreTrainedTokenizerFast.apply_chat_template` or by vLLM's `/v1/chat/completions`. No newline follows
a role token, so no merge can cross from the prompt into the answer: the model is trained on exactly
the ids it is later prompted with. The turn ends with the pre-training eos, which every engine already
stops on.

The loss mask (`encode_chat(...).mask`) covers each assistant message's content and its `<|eos|>`
(the model learns to answer and to stop), never the prompt, role tokens or `<|bos|>`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from factory.home import artifacts_dir
from factory.lake import Lake
from factory.lake.lineage import LineageRecord
from factory.tokenize.bpe import SPECIAL_TOKENS, TokenizerArtifact, _save, load_tokenizer, tokenizer_artifact
from factory.version import canonical_json, code_version, env_lock_hash

ROLES = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
BOS, EOS = SPECIAL_TOKENS["bos"], SPECIAL_TOKENS["eos"]

# Jinja, as transformers and vLLM render it; an unknown role is an error rather than silent text
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role'] + ': use system, user or assistant') }}{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


class ChatError(ValueError):
    pass


@dataclass(frozen=True)
class Encoded:
    ids: list[int]
    mask: list[bool]  # per id: does the loss predict it (assistant content and its eos)


def is_chat_tokenizer(tokenizer) -> bool:
    return all(tokenizer.token_to_id(t) is not None for t in ROLES.values())


def encode_chat(tokenizer, messages: list[dict], *, add_generation_prompt: bool = False) -> Encoded:
    """The ids of `messages` in the chat format and the loss mask over them (module docstring)."""
    special = {t: tokenizer.token_to_id(t) for t in (BOS, EOS, *ROLES.values())}
    if None in special.values():
        raise ChatError(f"the tokenizer has no chat tokens {[t for t, i in special.items() if i is None]}: "
                        "fine-tune from a chat tokenizer (factory.posttrain.chat.chat_tokenizer)")
    ids, mask = [special[BOS]], [False]
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ChatError(f"message {i}: unknown role {role!r}: use one of {sorted(ROLES)}")
        if not isinstance(content, str):
            raise ChatError(f"message {i} ({role}): content must be text, got {type(content).__name__}")
        body = tokenizer.encode(content, add_special_tokens=False).ids
        learn = role == "assistant"
        ids += [special[ROLES[role]], *body, special[EOS]]
        mask += [False] + [learn] * (len(body) + 1)
    if add_generation_prompt:
        ids.append(special[ROLES["assistant"]])
        mask.append(False)
    return Encoded(ids, mask)


def chat_tokenizer(lake: Lake, base: TokenizerArtifact | str, *, run_id: str = "",
                   asset_key: str = "sft_run") -> TokenizerArtifact:
    """The chat version of a tokenizer (`base`: an artifact or its version id): the base plus the role
    tokens as special tokens, appended after its vocabulary (existing ids unchanged). Content-addressed
    under the artifacts' tokenizers, recorded once in lineage with the base as its parent."""
    from tokenizers import AddedToken

    if isinstance(base, str):
        base = tokenizer_artifact(lake, base)
    tokenizer = load_tokenizer(base.path)
    if is_chat_tokenizer(tokenizer):
        return base
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ROLES.values()])
    blob = tokenizer.to_str().encode()
    digest = hashlib.sha256(blob).hexdigest()
    name = f"{base.name}-chat"
    directory = artifacts_dir(lake.home) / "tokenizers" / f"{name}-{digest[:12]}"
    artifact = base.model_copy(update={
        "name": name, "version_id": f"tokenizer/{name}@{digest[:12]}", "path": str(directory), "content_hash": digest,
        "vocab_size": tokenizer.get_vocab_size(),
        "special_ids": {**base.special_ids, **{role: tokenizer.token_to_id(t) for role, t in ROLES.items()}}})
    _save(directory, blob, artifact)
    if not lake.lineage.records(version_id=artifact.version_id):
        lake.lineage.record(LineageRecord(
            version_id=artifact.version_id, kind="tokenizer", name=f"tokenizer/{name}", uri=directory.as_uri(),
            content_hash=digest, upstream=[base.version_id], config_json=canonical_json({"roles": ROLES}),
            config_hash=digest[:16], code_version=code_version(), env_lock=env_lock_hash(), asset_key=asset_key,
            run_id=run_id, metadata_json=canonical_json(artifact.model_dump(exclude={"path", "name", "version_id"})),
        ))
    return artifact
