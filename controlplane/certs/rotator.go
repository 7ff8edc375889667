package certs

import (
	"context"
	"fmt"
	"time"
)

// Rotator keeps the certificates fresh: Run calls Ensure (and EnsureSecret for Secret) now,
// every CheckInterval and when a renewal is due, and hands the CA bundle to Inject each time.
type Rotator struct {
	Options Options
	// CA, when set, is the CA Secret (casecret.go): each check copies it into Options.Dir
	// (SyncCA) before Ensure, whose Options must then say ExternalCA.
	CA *CASecret
	// ManageCA makes each check keep the CA Secret too (EnsureCA): the process owns the CA.
	ManageCA bool
	// Secret, when set, is a Secret in which Run keeps a serving certificate of the same CA
	// (the handlers' nodeapi.HandlerCertSecret).
	Secret *SecretCert
	// Inject receives the CA bundle after every check, not only when it changes, so that a
	// configuration re-applied without it (kubectl apply of the manifests) gets it back within
	// CheckInterval; InjectCABundle and InjectAPIServiceCABundle write only what differs. Nil
	// injects nothing.
	Inject func(ctx context.Context, bundle []byte) error
	// CheckInterval bounds the wait between checks (a renewal is also checked at its due time);
	// one minute when 0. Errors are retried after it.
	CheckInterval time.Duration
	// OnError, when set, is told about failed checks and injections (Run keeps going).
	OnError func(error)
	// OnRotate, when set, is told about every check that wrote a certificate.
	OnRotate func(State)
}

// Run keeps the certificates fresh until ctx ends. It returns ctx's error; failures are passed
// to OnError and retried.
func (r *Rotator) Run(ctx context.Context) error {
	interval := r.CheckInterval
	if interval <= 0 {
		interval = time.Minute
	}
	now := r.Options.Now
	if now == nil {
		now = time.Now
	}
	for {
		wait := interval
		if renewAt, ok := r.check(ctx); ok {
			if until := renewAt.Sub(now()); until < wait {
				wait = max(until, 10*time.Millisecond)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// check runs one round; ok says renewAt is when the next renewal is due.
func (r *Rotator) check(ctx context.Context) (renewAt time.Time, ok bool) {
	caRenewAt, caChanged := r.syncCA(ctx)
	st, err := Ensure(r.Options)
	if err != nil {
		r.report(fmt.Errorf("ensure certificates: %w", err))
		return time.Time{}, false
	}
	st.CARotated = st.CARotated || caChanged
	renewAt, ok = earlier(st.RenewAt, caRenewAt), true
	if r.Secret != nil {
		secretRenewAt, rotated, err := EnsureSecret(ctx, r.Options, st, *r.Secret)
		if err != nil {
			r.report(fmt.Errorf("ensure certificate secret %s/%s: %w", r.Secret.Namespace, r.Secret.Name, err))
		} else {
			st.SecretRotated = rotated
			renewAt = earlier(renewAt, secretRenewAt)
		}
	}
	if (st.Rotated || st.CARotated || st.ClientRotated || st.SecretRotated) && r.OnRotate != nil {
		r.OnRotate(st)
	}
	if r.Inject != nil {
		if err := r.Inject(ctx, st.Bundle); err != nil {
			r.report(fmt.Errorf("inject CA bundle: %w", err))
		}
	}
	return renewAt, ok
}

func (r *Rotator) report(err error) {
	if r.OnError != nil {
		r.OnError(err)
	}
}

// syncCA keeps the CA Secret when the Rotator owns it and copies it into the certificate
// directory. Failures are reported; Ensure then goes on with the CA the directory has (and
// fails, naming it, when there is none). caRenewAt is when the CA is next due (far in the
// future when the Rotator does not own it).
func (r *Rotator) syncCA(ctx context.Context) (caRenewAt time.Time, changed bool) {
	caRenewAt = time.Unix(1<<40, 0)
	if r.CA == nil {
		return caRenewAt, false
	}
	if r.ManageCA {
		at, _, err := EnsureCA(ctx, r.Options, *r.CA)
		if err != nil {
			r.report(err)
		} else {
			caRenewAt = at
		}
	}
	changed, err := SyncCA(ctx, r.Options.Dir, *r.CA)
	if err != nil {
		r.report(err)
	}
	return caRenewAt, changed
}
