"""The pieces of the application layer that ``interlock.llm.LLM`` and ``policy run`` are
built from, one concern per module: prompts and outputs, the tokenizer and chat template,
and creating the runner a decision names."""
