"""What the scripts share: settings, data, checkpoints, errors and the run's guards."""
