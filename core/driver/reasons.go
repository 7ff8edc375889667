package driver

// Reasons a hypervisor driver gives for a VM's transitions (VMStatus.reason, Event.reason). The
// node handler turns them into VMI conditions, so drivers share these words; a driver may add
// its own CamelCase reason for a cause none of these names.
const (
	ReasonCreated            = "Created"
	ReasonStarted            = "Started"
	ReasonPaused             = "Paused"
	ReasonResumed            = "Resumed"
	ReasonGuestReset         = "GuestReset"
	ReasonHostReset          = "HostReset"
	ReasonPowerdownRequested = "PowerdownRequested"
	// ReasonGuestShutdown: the guest powered off by itself.
	ReasonGuestShutdown = "GuestShutdown"
	ReasonGuestPanicked = "GuestPanicked"
	ReasonKilled        = "Killed"
	// ReasonForcedShutdown: the guest did not power off within the Shutdown timeout.
	ReasonForcedShutdown = "ForcedShutdown"
	// ReasonProcessExited: the VM process ended without being asked to.
	ReasonProcessExited = "ProcessExited"
	// ReasonProcessGone: Recover found no VM process.
	ReasonProcessGone = "ProcessGone"
	ReasonRecovered   = "Recovered"
	ReasonStartFailed = "StartFailed"
	// ReasonMigrated: at the source, the VM moved to the target and stopped here; at the
	// target, the VM arrived and runs.
	ReasonMigrated = "Migrated"
	// ReasonIncomingMigration: a migration target waits for the source's state (PAUSED).
	ReasonIncomingMigration = "IncomingMigration"
	// ReasonMigrationFailed: a migration target stopped because the migration failed; a source
	// crashed because it failed after the switch to post-copy.
	ReasonMigrationFailed = "MigrationFailed"
	// ReasonMigrationCancelled: a migration target stopped by CancelMigration.
	ReasonMigrationCancelled = "MigrationCancelled"
)
