"""Bare decode loops over a loaded runner: no scheduler, no engine thread, greedy.

* `raw_batched_decode`: every prompt in one batch, then one token a sequence a step: the yardstick
  `homeai bench engine` holds the engine's throughput against.
* `raw_two_context_decode`: the step pattern that aborted with CUDA graphs on (issue 16), each step
  decoding half the sequences in the main context and half in the interactive one, back to back,
  then sampling both, as `Runner.run` does (`homeai.bench.graphs_repro`, a GPU check).

Both are built on `Runner.decode_greedy` (a `llama_decode` a context, then each row's greedy token): the
runner stays the only module that calls llama.cpp, the loops' logic lives here. Each starts and
ends with an empty cache (`Runner.reset`).
"""

from __future__ import annotations

import time

from homeai.llama import Runner, RunnerError
from homeai.sched.pools import Pool


def raw_batched_decode(runner: Runner, prompts: list[list[int]], num_steps: int) -> dict:
    """Decode `num_steps` tokens for each prompt (its first from the prefill), all in one batch a step."""
    runner.reset()
    start = time.perf_counter()
    tokens = [0] * len(prompts)
    for group in batches(prompts, runner.cfg.n_batch):  # the prompts, in as few decodes as the batch allows
        [picked] = runner.decode_greedy([(Pool.MAIN, [(seq, 0, prompts[seq]) for seq in group])])
        for seq, token in zip(group, picked):
            tokens[seq] = token
    positions = [len(p) for p in prompts]
    prefill_s = time.perf_counter() - start
    for _ in range(num_steps - 1):
        [tokens] = runner.decode_greedy([(Pool.MAIN, [(seq, positions[seq], [t]) for seq, t in enumerate(tokens)])])
        positions = [p + 1 for p in positions]
    elapsed = time.perf_counter() - start
    runner.reset()
    return {"seconds": elapsed, "prefill_seconds": prefill_s, "tokens": len(prompts) * num_steps}


def batches(prompts: list[list[int]], capacity: int) -> list[list[int]]:
    """The prompts' indices in groups of at most `capacity` tokens, in order."""
    groups: list[list[int]] = [[]]
    used = 0
    for i, prompt in enumerate(prompts):
        if len(prompt) > capacity:
            raise RunnerError(f"a {len(prompt)}-token prompt does not fit one batch of {capacity}")
        if used + len(prompt) > capacity:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += len(prompt)
    return groups


def raw_two_context_decode(runner: Runner, prompts: list[list[int]], num_steps: int) -> dict:
    """The even prompts decoded in the main context, the odd ones in the interactive context, in
    every step; each prompt's `num_steps` greedy tokens, in order."""
    if runner.ictx is None:
        raise RunnerError("two generation contexts need model.interactive_n_ctx > 0")
    runner.reset()
    start = time.perf_counter()
    sides = [(Pool.MAIN, list(range(0, len(prompts), 2))), (Pool.INTERACTIVE, list(range(1, len(prompts), 2)))]
    outputs: list[list[int]] = [[] for _ in prompts]
    for step in range(num_steps):
        groups = [(pool, _rows(prompts, outputs, indices, step)) for pool, indices in sides]
        for (_, indices), tokens in zip(sides, runner.decode_greedy(groups)):
            for i, token in zip(indices, tokens):
                outputs[i].append(token)
    elapsed = time.perf_counter() - start
    runner.reset()
    return {"seconds": elapsed, "tokens": len(prompts) * num_steps, "outputs": outputs}


def _rows(prompts: list[list[int]], outputs: list[list[int]], indices: list[int], step: int) -> list:
    """One context's rows at `step`: its prompts whole at the first, then each one's last token."""
    if step == 0:
        return [(seq, 0, prompts[i]) for seq, i in enumerate(indices)]
    return [(seq, len(prompts[i]) + step - 1, [outputs[i][-1]]) for seq, i in enumerate(indices)]
