"""Chest X-ray data: on-disk layouts, splits, the preprocessing cache, transforms, embedded data."""
