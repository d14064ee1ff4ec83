package metricsserver

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

// Certificate is the server's TLS certificate: the files CertFile and
// KeyFile when both are set (read again when either changes, so a rotated
// Secret is picked up without a restart), else a self-signed certificate
// generated once for Host.
type Certificate struct {
	CertFile, KeyFile string
	// Host is the self-signed certificate's subject (the node name).
	Host string

	mu      sync.Mutex
	current *tls.Certificate
	certMod time.Time
	keyMod  time.Time
}

// Load returns the certificate to serve, reading or generating it first if
// needed. A missing or bad file is an error that names it.
func (c *Certificate) Load() (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, fmt.Errorf("metrics TLS: set both the certificate file and the key file or neither (certificate %q, key %q)", c.CertFile, c.KeyFile)
	}
	if c.CertFile == "" {
		if c.current == nil {
			certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(c.Host, nil, nil)
			if err != nil {
				return nil, fmt.Errorf("metrics TLS: generate a self-signed certificate: %w", err)
			}
			pair, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				return nil, fmt.Errorf("metrics TLS: self-signed certificate: %w", err)
			}
			c.current = &pair
		}
		return c.current, nil
	}
	certInfo, err := os.Stat(c.CertFile)
	if err != nil {
		return nil, fmt.Errorf("metrics TLS certificate file: %w", err)
	}
	keyInfo, err := os.Stat(c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("metrics TLS key file: %w", err)
	}
	if c.current != nil && certInfo.ModTime().Equal(c.certMod) && keyInfo.ModTime().Equal(c.keyMod) {
		return c.current, nil
	}
	pair, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		if c.current != nil {
			// Halfway through a rotation (the certificate written, the key
			// not yet): keep serving the previous pair.
			return c.current, nil
		}
		return nil, fmt.Errorf("metrics TLS: certificate %s and key %s: %w", c.CertFile, c.KeyFile, err)
	}
	c.current, c.certMod, c.keyMod = &pair, certInfo.ModTime(), keyInfo.ModTime()
	return c.current, nil
}

// TLSConfig serves the certificate (re-reading changed files per handshake),
// TLS 1.2 or newer.
func (c *Certificate) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.Load()
		},
	}
}
