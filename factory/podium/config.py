"""`PodiumConfig`: where Podium listens, who its users are, and the limits it enforces."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from factory.home import factory_home


class PodiumConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="Address to bind (loopback unless an auth proxy fronts it).")
    port: int = Field(8100, ge=1, le=65535)
    auth: Literal["tokens", "header"] = Field(
        "tokens", description="tokens = a token list (tokens_file: token -> user, the embedded default); "
                              "header = the user name an auth proxy sets in `user_header`.")
    user_header: str = Field("X-Forwarded-User", description="auth=header: the header naming the user.")
    tokens_file: Path | None = Field(None, description="auth=tokens: JSON {token: user}; default "
                                                       "FACTORY_HOME/podium/tokens.json, made with one user at first start.")
    secret_file: Path | None = Field(None, description="Key of the CSRF tokens; default FACTORY_HOME/podium/secret.")
    backend: Literal["profile", "local", "openai"] = Field(
        "profile", description="local = in-process; openai = the profile's inference endpoint; profile = openai "
                               "when the profile's inference kind is openai, else local.")
    pairing: Literal["random", "leader"] = Field(
        "random", description="Battle pairs: random, or the least-voted export against the leader.")
    max_prompt_chars: int = Field(4000, ge=1, description="Longer prompts are refused (HTTP 413).")
    max_new_tokens: int = Field(256, ge=1, description="The most tokens a user may ask one generation for.")
    generations_per_minute: int = Field(20, ge=1, description="Per-user rate limit on chats and battles (HTTP 429).")
    page_size: int = Field(50, ge=1, le=1000, description="Rows per page in the dataset browser.")
    max_models: int = Field(4, ge=2, description="local backend: exports kept loaded at once.")


def podium_dir() -> Path:
    path = factory_home() / "podium"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_tokens(config: PodiumConfig) -> dict[str, str]:
    """token -> user; the default file is created with one user, `local`, when missing."""
    path = config.tokens_file or podium_dir() / "tokens.json"
    if not path.exists():
        if config.tokens_file is not None:
            raise ValueError(f"tokens_file {path}: does not exist")
        path.write_text(json.dumps({secrets.token_urlsafe(18): "local"}, indent=1))
        path.chmod(0o600)
    try:
        tokens = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"tokens_file {path}: not JSON ({e})") from None
    if not isinstance(tokens, dict) or not tokens or not all(isinstance(k, str) and isinstance(v, str) and k and v
                                                             for k, v in tokens.items()):
        raise ValueError(f"tokens_file {path}: must map tokens to user names, {{\"<token>\": \"<user>\"}}")
    return tokens


def load_secret(config: PodiumConfig) -> bytes:
    path = config.secret_file or podium_dir() / "secret"
    if not path.exists():
        path.write_bytes(secrets.token_bytes(32))
        path.chmod(0o600)
    return path.read_bytes()
