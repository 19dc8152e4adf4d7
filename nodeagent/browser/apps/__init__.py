"""The web apps of web tasks. Each is one file shipped into the sandbox and run by the image's
python3 (standard library only); the host imports it for its pure helpers (digests, evaluation).
"""
