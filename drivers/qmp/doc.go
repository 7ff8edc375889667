// Package qmp is Kubevisor's QEMU hypervisor driver: it runs each VM as a qemu-system-x86_64
// process, controls it over QMP (github.com/digitalocean/go-qemu) and serves the serial console.
//
// Process model: QEMU runs in its own session with its output in <run dir>/qemu.log, so it
// outlives the driver; a new driver process re-adopts it with Recover. QEMU exits when the guest
// powers off (no -no-shutdown), which makes the VM STOPPED; Start launches a new process.
//
// # Live migration
//
// The driver declares FEATURE_HYPERVISOR_MIGRATE and migrates with QEMU's own migration over
// unix sockets only (migrate.go has the details): a target (DomainSpec.incoming_migration) runs
// QEMU with -incoming defer and migrate-incoming unix:<socket_path>, PAUSED (IncomingMigration)
// until QEMU reports the migration completed, then cont: RUNNING (Migrated). A source sets the
// capabilities events, return-path, auto-converge and postcopy-ram (the last two as the request
// allows) and max-bandwidth (the request's limit, else 1 TiB/s instead of QEMU's 32 MiB/s),
// runs migrate unix:<target_socket_path>, and samples query-migrate every 0.5 s: post-copy
// (migrate-start-postcopy) when allowed and two passes leave no less to send, or at the
// completion timeout, which cancels (migrate_cancel) a migration that may not switch. The source
// stops (STOPPED, Migrated) once QEMU says completed, which with the return path means the target
// loaded the state. QEMU's MIGRATION events go through the event loop as the driver's MIGRATION
// events; the switch-over's STOP and RESUME are not reported.
//
// Recover of a VM mid-migration: the migration is in the VM's record (state dir), and QEMU goes
// on migrating while no driver runs. A new driver re-adopts a waiting target as PAUSED
// (IncomingMigration) and a migrating source as RUNNING with its migration ACTIVE, and restarts
// the source's watcher (completion timeout, post-copy rule); a migration that completed
// meanwhile is finished (the source's QEMU, paused in postmigrate, is ended; the target, paused,
// is run), one that failed or was cancelled is recorded so, the source running.
//
// Disks (Capabilities.migration_disks, migratedisks.go): the writable node-local disks a
// migration names are copied by block mirroring before the memory: the target serves them over
// NBD on incoming_migration.disks_socket_path (nbd-server-start, block-export-add writable), the
// source mirrors each into its export (blockdev-mirror, sync top or full) and starts the memory
// once every mirror is ready; with pause-before-switchover QEMU stops at the switch-over, the
// guest paused, and the driver completes the mirrors (block-job-cancel of ready jobs: the
// target in sync) before migrate-continue sends the device state, so the target runs only with
// every write. A failure or cancel cancels the mirrors; the source runs on its own disks.
//
// Limits: disks not named in the migration must be shared (the target sees the source's image at
// its spec's path: shared storage, or one host). The request's bandwidth limit applies to the
// memory stream and to each mirror (its speed), not to their sum. Post-copy of a VM whose disks
// are copied goes through the same pre-switchover pause: the mirrors complete before post-copy
// starts (TestMigrationDisksPostCopy). A driver restart in the middle of the switch-over, after
// it dismissed a completed mirror, cancels the migration (the source runs on): the job's outcome
// is gone. QEMU refuses to migrate
// a VM with a VFIO host device (Migrate: FailedPrecondition with QEMU's reason). Migration of a
// VM with a TPM (swtpm) or a persistent EFI variable store is untested.
package qmp
