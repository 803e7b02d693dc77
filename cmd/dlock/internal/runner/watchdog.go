package runner

// watchdogEnv marks a process started as a run's watchdog (see MaybeRunWatchdog).
const watchdogEnv = "DLOCK_RUN_WATCHDOG"
