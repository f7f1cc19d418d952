"""The turn formats homeai knows by name: a chat template of its own for each family, for a GGUF
that carries none, and how the family is told from the model.

A GGUF without `tokenizer.chat_template` (Gemma 3 270M is one) still has a turn format: the one it
was trained on, whose markers are control tokens of its vocabulary. Formatting it in another
family's turns (llama.cpp's built-in formatter guessed ChatML) makes the model run on past its turn
into invented ones. So the family is read from the model: its architecture where that settles it
(`general.architecture` gemma, gemma2, gemma3, gemma3n: every Gemma speaks Gemma's turns), else the
first family whose markers are all control tokens of the vocabulary (`<start_of_turn>`: Gemma;
`<|start_header_id|>`: Llama 3; `<|im_start|>`: ChatML; ...). A llama-architecture GGUF may speak
Llama 3's, ChatML or Mistral's turns, so only the vocabulary tells those apart.

Each family's template is a file in `templates/` (`<name>.jinja`), written here in the family's
documented turn format. They format turns only and render no tool definitions, so a model served
with one gets tools the generic way (described in the system prompt, its calls held to a grammar:
homeai.tools reads that from the template's source). `model.chat_template` may name a family to use
instead of the GGUF's own.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class Family:
    name: str
    summary: str  # what its turns look like, for the README and error messages
    markers: tuple[str, ...]  # control-token texts a vocabulary holds, all of them, when it speaks this family
    openers: tuple[str, ...]  # the control-token texts that open a turn
    architectures: tuple[str, ...] = ()  # `general.architecture` values that settle it alone

    @property
    def source(self) -> str:
        return _source(self.name)


# In the order the vocabulary is asked: a family whose markers another's vocabulary may also hold
# comes after that one (a Phi-4 or Granite vocabulary may hold `<|im_start|>` too).
FAMILIES: tuple[Family, ...] = (
    Family("gemma", "<start_of_turn>user ... <end_of_turn>, the model's turn `model`, system text in the first user turn",
           ("<start_of_turn>", "<end_of_turn>"), ("<start_of_turn>",), ("gemma", "gemma2", "gemma3", "gemma3n")),
    Family("llama3", "<|start_header_id|>role<|end_header_id|> ... <|eot_id|>",
           ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), ("<|start_header_id|>",)),
    Family("granite", "<|start_of_role|>role<|end_of_role|> ... <|end_of_text|>",
           ("<|start_of_role|>", "<|end_of_role|>"), ("<|start_of_role|>",), ("granite", "granitemoe", "granitehybrid")),
    Family("phi4", "<|system|> ... <|end|><|user|> ... <|end|><|assistant|>",
           ("<|user|>", "<|assistant|>", "<|end|>"), ("<|system|>", "<|user|>", "<|assistant|>")),
    Family("mistral", "[INST] ... [/INST] answer</s>, system text in the first user turn",
           ("[INST]", "[/INST]"), ("[INST]",)),
    Family("chatml", "<|im_start|>role ... <|im_end|>", ("<|im_start|>", "<|im_end|>"), ("<|im_start|>",)),
)

# A control token that opens a turn never belongs inside a reply: a model that writes one has run past
# the end of its turn into one it invents (a base model, or one served in another family's turns,
# does), so the runner ends the reply there, as at its end-of-turn token. (gpt-oss's `<|start|>` is
# not one: harmony opens its final message with it inside the reply.)
TURN_OPENERS = frozenset(text for family in FAMILIES for text in family.openers)

BY_NAME = {f.name: f for f in FAMILIES}
NAMES = tuple(sorted(BY_NAME))
FALLBACK = BY_NAME["chatml"]  # the most common format, and what llama.cpp's formatter used


@dataclass(frozen=True)
class Detected:
    family: Family
    reason: str  # why, for the start log and `homeai doctor`
    guessed: bool = False  # nothing in the model named it: the fallback


def detect(architecture: str, control_texts: Sequence[str]) -> Detected:
    """The family a model speaks, from its architecture, else its vocabulary's control tokens."""
    for family in FAMILIES:
        if architecture in family.architectures:
            return Detected(family, f"chosen from architecture {architecture}")
    vocabulary = set(control_texts)
    for family in FAMILIES:
        if vocabulary.issuperset(family.markers):
            return Detected(family, f"chosen from the vocabulary's {family.markers[0]} token")
    return Detected(FALLBACK, f"neither architecture {architecture or '(none)'} nor the vocabulary names a "
                              f"turn format homeai knows, so ChatML, the most common one", guessed=True)


@functools.cache
def _source(name: str) -> str:
    return resources.files(__package__).joinpath("templates", f"{name}.jinja").read_text(encoding="utf-8")
