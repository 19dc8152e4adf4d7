"""Paddock nodeagent package."""
