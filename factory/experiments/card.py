"""The experiment card: a structured Markdown page per planned run, shown in the Dagster UI and
saved beside the run's checkpoints, so anyone can see what was trained without reading code. An
RL run queued by a sweep gets one too (`render_rl_card`)."""

from __future__ import annotations

from pathlib import Path

from factory.experiments.spec import Plan
from factory.experiments.sweep import run_name
from factory.home import run_dir


def write_card(home: Path, run: str, card: str) -> Path:
    """The card beside the run's checkpoints: written when the run is queued, again when it starts."""
    path = run_dir(home, run) / "card.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(card)
    return path


def render_card(plan: Plan) -> str:
    e = plan.experiment
    table = "\n".join(f"| {k} | {v} |" for k, v in card_rows(plan))
    return (f"# Experiment `{e.name}`\n\n{e.description or '(no description)'}\n\n"
            f"| | |\n|---|---|\n{table}\n\n"
            f"Run it: `factory experiment submit {e.name}` (queued in Dagster as run `{run_name(e)}`) "
            f"or `{launch_line(plan)} --experiment {e.name}`\n")


def card_rows(plan: Plan) -> list[tuple[str, str]]:
    """The card's (field, value) rows; the Dagster asset shows them as a table."""
    e, m = plan.experiment, plan.model
    o, s = e.optimizer, e.schedule
    return [
        ("mix", f"`{plan.mix_version}`" + (" (followed live)" if e.follow_mix and "@" not in e.mix else " (pinned)")),
        *([("mix weights", ", ".join(f"{t} {w:g}" for t, w in e.mix_weights.items()) + " (the mix's own replaced)")]
          if e.mix_weights else []),
        ("tokenizer", f"`{plan.tokenizer}` ({m.vocab_size:,} tokens)"),
        ("sequence length", f"{plan.seq_len} tokens"),
        ("batch", f"{e.global_batch} sequences = {plan.tokens_per_step:,} tokens / step "
                  f"(micro-batch {e.micro_batch} x {e.parallel.world_size} ranks x {plan.grad_accum} accumulation)"),
        ("length", f"{plan.steps:,} steps = {plan.tokens:,} tokens"),
        ("model", f"{plan.parameters / 1e6:.2f} M parameters: d_model {m.d_model}, {m.n_layers} layers, "
                  f"{m.n_heads} heads / {m.kv_heads} kv heads (head {m.head_dim}), SwiGLU {m.ffn_dim}, "
                  f"RoPE θ={m.rope_theta:g}, {'tied' if m.tie_embeddings else 'untied'} embeddings"
                  + (f", muP base width {m.mup_base_width}" if m.mup_base_width else "")),
        ("optimizer", f"AdamW lr {o.lr:g}, betas {o.betas}, wd {o.weight_decay:g}, clip {o.grad_clip}"),
        ("schedule", f"{s.kind}, warmup {s.warmup_steps} steps, floor {s.min_lr_ratio:g} x lr"),
        ("precision", f"{e.precision}" + (", torch.compile" if e.compile else "") + " (logits and loss in fp32)"),
        ("checkpoints", f"every {e.checkpoint.every} steps, keep {e.checkpoint.keep_last}"),
        ("evaluation", f"every {e.eval_every} steps"),
        ("parallelism", f"{e.parallel.world_size} process(es), backend {e.parallel.backend}"
                        + (", FSDP2" if e.parallel.fsdp else "")),
        ("guards", f"non-finite: {e.guards.nonfinite}; spikes > {e.guards.spike_sigma:g} sigma over "
                   f"{e.guards.spike_window} steps: {e.guards.spike_action}"),
        ("replica checks", f"parameter hashes every {e.replicas.hash_every} steps"
                           + ("; redundant gradient dry runs" if e.replicas.redundant_dry_run else "")),
        ("seed", str(e.seed)),
        ("identity hash", f"`{plan.config_hash}`"),
    ]


def launch_line(plan: Plan) -> str:
    """The command that trains this plan outside Dagster."""
    e = plan.experiment
    n, nodes = e.parallel.nproc_per_node, e.parallel.nnodes
    if nodes > 1:  # one agent per node at the profile's c10d rendezvous (factory.train.launch)
        return (f"torchrun --nnodes {nodes} --node-rank <R> --nproc-per-node {n} --rdzv-backend c10d "
                f"--rdzv-endpoint <training.rdzv_endpoint> -m factory.train")
    if n > 1:
        return f"torchrun --standalone --nproc-per-node {n} -m factory.train"
    return "python -m factory.train"


def render_rl_card(config, source: str = "") -> str:
    """An RL run's card (`RLConfig`): what it starts from, how it samples and learns, where it was queued from."""
    r, g, o = config.rollout, config.grpo, config.optimizer
    rows = [
        ("start", f"`{config.start}`"),
        ("reward", f"{config.reward}" + (f" on `{config.task_table}`" if config.task_table else "")),
        ("algorithm", f"{config.algorithm}: clip {g.clip_eps:g}, KL {g.kl_coef:g}, {g.aggregation} mean"
                      + (", std-scaled advantages" if g.scale_rewards else "")),
        ("rollouts", f"{r.prompts_per_step} prompts x {r.group_size} completions / step, at most {r.max_tokens} "
                     f"tokens each ({r.actor})"),
        ("length", f"{config.steps:,} steps ({config.mode}, max staleness {config.max_staleness})"),
        ("optimizer", f"AdamW lr {o.lr:g}, wd {o.weight_decay:g}, clip {o.grad_clip}"),
        ("checkpoints", f"every {config.checkpoint_every} steps; evaluated every {config.eval_every} ({config.eval_suite})"),
        ("seed", str(config.seed)),
        ("identity hash", f"`{config.identity_hash()}`"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    queued = f"Queued from {source} as " if source else "Runs as "
    return (f"# RL run `{config.name}`\n\n{config.description or '(no description)'}\n\n| | |\n|---|---|\n{table}\n\n"
            f"{queued}`rl_run` partition `{config.name}` (`rl_job`); rewards in `rl.rollouts`.\n")
