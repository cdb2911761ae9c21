"""Running training as an operation: launch commands, the supervisor that relaunches, the watchdog and
signals, and how freed host memory is handled."""
