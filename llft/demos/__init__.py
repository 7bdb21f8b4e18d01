"""`llft demo [service|messaging|spark]`: the main job and its companions."""
