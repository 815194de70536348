"""Rollouts: the actor samples `group_size` completions per task from vLLM and records, for every
sample, the policy version that made it and the log-prob of each sampled token under that policy.

The actor is vLLM in-process (the CPU wheel here, the same code on a GPU); its weights change only
through `WeightSync.push`, which sets `version`. Sampling is seeded per request (run seed, step and
task position; vLLM seeds sample j of a request with its seed + j, so requests' seeds are
`group_size` apart), so a resumed run regenerates the same rollouts for the same weights. The sampled
tokens' log-probs come from vLLM itself (`logprobs=0`: the chosen token's), which is the behaviour
policy the importance weight of factory.posttrain.rl.grpo needs; temperature is 1 and top-p off,
so they are the policy's own probabilities, not a sharpened distribution's.
"""

from __future__ import annotations

from dataclasses import dataclass

from factory.infer.engine import EngineConfig, cut_at_stop
from factory.infer.export import ExportRef
from factory.posttrain.rl.components import RLTask
from factory.posttrain.rl.config import RolloutConfig


@dataclass(frozen=True)
class Rollout:
    task: RLTask
    group: int  # position of the task in its step's batch
    sample: int  # position in the group
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    text: str  # the completion as scored: decoded, cut before the first stop string
    behaviour_logprobs: tuple[float, ...]
    finish_reason: str  # stop | length
    policy_version: int


class VLLMActor:
    """Generates groups from the engine's current weights (version `version`)."""

    def __init__(self, export: ExportRef, engine_config: EngineConfig):
        from factory.infer.engine import close_engines
        from factory.infer.vllm_engine import VLLMEngine

        # its own engine, never the process's shared one (open_engine): pushes change its weights, and an
        # eval asking for the export must not get them. vLLM holds one in-process engine at a time.
        close_engines()
        self.engine = VLLMEngine(export, engine_config)
        self.version = 0

    def prompt_ids(self, task: RLTask, room: int) -> list[int]:
        return self.engine.fit(self.engine.document_ids(task.prompt), room)

    def generate(self, tasks: list[RLTask], config: RolloutConfig, seed: int) -> list[Rollout]:
        from vllm import SamplingParams

        prompts = [self.prompt_ids(t, config.max_tokens) for t in tasks]
        params = [SamplingParams(n=config.group_size, temperature=1.0, top_p=1.0, max_tokens=config.max_tokens,
                                 seed=seed + i * config.group_size, stop=list(config.stop) or None, logprobs=0)
                  for i in range(len(tasks))]
        outputs = self.engine.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        rollouts = []
        for g, (task, prompt, out) in enumerate(zip(tasks, prompts, outputs)):
            for s, c in enumerate(out.outputs):
                ids = list(c.token_ids)
                logprobs = [step[tok].logprob for tok, step in zip(ids, c.logprobs)]
                text, _ = cut_at_stop(c.text, config.stop)
                rollouts.append(Rollout(task=task, group=g, sample=s, prompt_ids=tuple(prompt),
                                        completion_ids=tuple(ids), text=text, behaviour_logprobs=tuple(logprobs),
                                        finish_reason="stop" if c.finish_reason == "stop" else "length",
                                        policy_version=self.version))
        return rollouts

    def close(self) -> None:
        self.engine.close()
