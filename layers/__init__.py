"""Paddock layers package."""
