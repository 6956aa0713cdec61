"""Live console updates over Channels: the `/ws/live/` endpoint (consumers.py), who hears
what (groups.py), how a message leaves a pipeline thread for the web server's event loop
(publish.py), what is sent when a verdict is committed, a job changes state or a job's
samples are stored (receivers.py, points.py). docs/console.md "Live updates"."""
