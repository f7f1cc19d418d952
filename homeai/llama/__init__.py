"""llama.cpp, and the only package that imports `llama_cpp`: one module a job, as llama.cpp's own
`src/` splits model, context, batch, sampling and grammar.

* `model`: the backend, the weights and contexts loaded, the model's facts and vocabulary.
* `sizing`: each generation cache's cells, from the model and the memory free at load.
* `batch`: the batch one `llama_decode` reads.
* `sampling`: each request's pick from its row's logits, grammars weighed within a step budget.
* `grammar`: JSON schemas as GBNF text (the converter the tools are handed).
* `grammar_worker`: the grammar checker's process (`python -m homeai.llama.grammar_worker`).
* `runner`: the `Runner` the engine steps, tying the rest together.

Above the engine only the program's assembly (the commands, and where the runner is built) imports
this package; the tools get its JSON-schema converter as a value (`Runner.schema_converter`).
"""

from homeai.llama.grammar import CONVERTER, GrammarError, json_schema_grammar
from homeai.llama.model import ModelInfo, RunnerError, backend_facts, chat_template_choice
from homeai.llama.runner import Runner
from homeai.llama.sampling import GrammarOverBudget
from homeai.llama.sizing import kv_sizes

__all__ = ["CONVERTER", "GrammarError", "GrammarOverBudget", "ModelInfo", "Runner", "RunnerError", "backend_facts",
           "chat_template_choice", "json_schema_grammar", "kv_sizes"]
