//go:build !linux

package plugin

func becomeSubreaper() {}
