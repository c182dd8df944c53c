"""Past one machine: node-local partials, a bus between the tiers, the central merger (docs/scale-out.md)."""
