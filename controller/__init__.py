"""Paddock controller package."""
