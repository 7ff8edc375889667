// Command e2e-httpget GETs a URL from inside a pod for the cluster conformance suite and prints
// the status line and body; it retries while the guest is not answering yet and exits non-zero
// unless it got a 2xx answer. Stdlib only, so it builds static for a scratch image.
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	retryFor := flag.Duration("retry-for", 0, "keep trying this long while the request fails")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: e2e-httpget [--retry-for D] URL")
		os.Exit(2)
	}
	url := flag.Arg(0)
	c := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(*retryFor)
	for {
		err := get(c, url)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "e2e-httpget:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "e2e-httpget: retrying:", err)
		time.Sleep(time.Second)
	}
}

func get(c *http.Client, url string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	fmt.Printf("%s %s\n%s", resp.Proto, resp.Status, body)
	return nil
}
