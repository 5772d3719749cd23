"""``gpumarket agents``: the registered agents and the seats they fill.

Light on purpose: ``gpumarket agents`` must start in well under half a second, so this module
imports neither the agents nor the run stack (the listing of the built-in agents is
:mod:`market.cli.agent_catalogue`). The other commands are in :mod:`market.cli.run_commands`,
:mod:`market.cli.record_commands`, :mod:`market.cli.validate_command`, the ``*_command`` modules,
``market.bench.suite`` and ``market.train.training_data``, each imported when its command runs
(:func:`market.cli.handler`).
"""

from __future__ import annotations

import argparse
import sys

from market.cli.agent_catalogue import BUILT_IN, OTHER_SPECS, installed_plugins


def cmd_agents(args: argparse.Namespace) -> int:
    # the built-ins from the catalogue (importing them would import the env); plug-ins are
    # imported, so that a broken one shows here, only when one is installed
    for name, roles, text in BUILT_IN:
        print(f"{name:<18} {roles:<16} {text}")
    built_in = {name for name, _, _ in BUILT_IN}
    broken = []
    for plugin in installed_plugins():
        if plugin.name in built_in:
            continue
        if plugin.error is None:
            print(
                f"{plugin.name:<18} {','.join(plugin.roles):<16} {plugin.doc} (plug-in {plugin.target})"
            )
        else:
            broken.append(plugin.name)
            print(f"{plugin.name:<18} {'BROKEN':<16} plug-in {plugin.target}: {plugin.error}")
    if broken:
        print(
            f"gpumarket agents: {len(broken)} plug-in(s) cannot be used ({', '.join(broken)}); "
            "fix or uninstall the distribution that registers them",
            file=sys.stderr,
        )
    print(f"also: {OTHER_SPECS}")
    return 0


__all__ = ["cmd_agents"]
