//go:build !race

package launcher_test

const raceEnabled = false
