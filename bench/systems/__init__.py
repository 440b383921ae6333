"""One module per system under test. Each exposes ``SCENARIOS`` (measurement name →
function taking :class:`bench.common.Params` and returning a dict of numbers) and, for
systems whose workers are not a ready-made command, a ``worker`` entry point run with
``python -m bench.systems.<name> worker …``."""
