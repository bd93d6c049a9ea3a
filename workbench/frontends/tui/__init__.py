"""The Textual front end. It reads telemetry and sends commands; it never runs training logic."""
