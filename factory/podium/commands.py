"""`factory podium`: start the web app on the lake of the active profile."""

from __future__ import annotations

import sys

from rich.console import Console


def cmd_podium(args, out: Console) -> int:
    import uvicorn
    from pydantic import ValidationError

    from factory.cli import open_lake
    from factory.podium.app import create_app
    from factory.podium.config import PodiumConfig, load_tokens

    fields = {k: v for k, v in {"host": args.host, "port": args.port, "auth": args.auth, "tokens_file": args.tokens_file,
                                "user_header": args.user_header,
                                "backend": args.backend, "pairing": args.pairing}.items() if v is not None}
    try:
        config = PodiumConfig(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        out.print(f"[red]podium: {'.'.join(map(str, error['loc']))}: {error['msg']}[/red]")
        return 2
    try:
        app = create_app(config, open_lake(args))
    except ValueError as exc:
        out.print(f"[red]podium: {exc}[/red]")
        return 2
    where = f"http://{config.host}:{config.port}"
    if config.auth == "tokens":
        tokens = load_tokens(config)
        for token, user in tokens.items():
            out.print(f"podium for {user}: {where}/login?token={token}")
    else:
        out.print(f"podium at {where} (users from the {config.user_header} header)")
    sys.stdout.flush()
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning")
    return 0
