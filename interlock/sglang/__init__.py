"""interlock and SGLang: the releases interlock has read, and the plugin inside SGLang
(:mod:`interlock.sglang.plugin`, entry point ``sglang.srt.plugins: interlock``).

A release is read when its resolution pipeline's steps, the seam the plugin wraps and the
fields it declares were checked against that release's own code (``tools/sglang_probe``
runs its resolution; ``make test-sglang`` runs the plugin inside it). The plugin refuses
any other release: what an unread release's later steps do with a declaration is not
known.
"""

from __future__ import annotations

#: The SGLang releases interlock has read (``conformance/sglang-<version>.jsonl``).
READ = ("0.5.23",)
