"""The monitors, by name, in the order they run and report: the one list of them.

Each name maps to its entry, the module that implements it (NAME, VERSION, DEFAULT thresholds and
``check``). closedloop/monitors/registry.py builds the registry from this table; config checks
params.yaml's monitors.block_promotion and monitors.thresholds against its names. A new monitor is a
new module in closedloop/monitors/, one line here and its import in the registry.

Builtins only, and outside the monitors package: config is code of every stage, and importing any
module of closedloop/monitors/ loads every monitor, so an edit to one would rerun the whole pipeline.
"""

from __future__ import annotations

MONITORS: dict[str, str] = {
    "reward_shift": "closedloop.monitors.reward_shift",
    "verifier_shift": "closedloop.monitors.verifier_shift",
    "proxy_gold_divergence": "closedloop.monitors.proxy_gold_divergence",
    "length_inflation": "closedloop.monitors.length_inflation",
    "format_only_wins": "closedloop.monitors.format_only_wins",
    "grpo_health": "closedloop.monitors.grpo_health",
    "anomaly_rates": "closedloop.monitors.anomaly_rates",
    "episode_gaming": "closedloop.monitors.episode_gaming",
    "canary": "closedloop.monitors.canary",
}
MONITOR_NAMES: tuple[str, ...] = tuple(MONITORS)
# Those whose default thresholds only warn (fail: null): a monitor in monitors.block_promotion must be
# able to fail. The registry refuses to load when a module's DEFAULT disagrees with this list.
WARN_ONLY_MONITORS: tuple[str, ...] = ("reward_shift", "verifier_shift")
