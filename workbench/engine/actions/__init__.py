"""What the keys do: cleanup, snapshot, profile. Each runs on the training thread between steps."""
