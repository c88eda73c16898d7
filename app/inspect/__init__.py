"""The session inspector's model: `model` turns a log into rows (barriers, repairs, the crash point), `follow` reads a
log another process is writing. The screen that shows them is `app/screens/inspector.py`."""
