"""The local demo: the scripted policy served over the OpenAI wire format, the small REINFORCE
trainer, and the local farm run (`paddock run`) that wires them to a real controller and
node agents. Analysts' code never imports this package.
"""
