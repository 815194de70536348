"""Porting: math word problems → Python programs that read the numbers from the text, verified in
the sandbox. Goal: code whose comments and names carry the reasoning a word problem leaves
implicit. Runs on CPU (the port is programmatic); swap the stage's generator for `kind="engine"`
with a template to have a model do the port, validators unchanged.

    .venv/bin/python -c "from configs.synth import pipeline; ..."   (the synth asset lands with issue 7)
"""

from factory.synth import PipelineConfig


def porting() -> PipelineConfig:
    return PipelineConfig(
        name="porting",
        description="Math word problems ported to checked Python programs.",
        seeds={"function": "factory.synth.porting:word_problems", "limit": 1000},  # of 1,500
        stages=[{"name": "port", "output": "program",
                 "generator": {"kind": "function", "function": "factory.synth.porting:port_to_python"}}],
        validators=[
            {"kind": "python_syntax"},
            {"kind": "length", "min_chars": 120, "max_chars": 4000},
            {"kind": "dedup", "against": ("synthetic.porting",)},
            {"kind": "decontaminate"},
            {"kind": "sandbox", "timeout_s": 10},
        ],
        text="{program}",
        kind="code",
    )
