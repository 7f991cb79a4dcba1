// Certificates for the test servers that speak TLS (Redis, PostgreSQL, etcd).
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * A throwaway CA and a server certificate it signs for localhost and 127.0.0.1, made by
 * openssl in a temp dir. Answers PEM text: { ca, cert, key } and the files' paths. The servers
 * read the files while the test process lives, so the dir goes when the process exits.
 */
export function makeTestCertificates() {
  const dir = mkdtempSync(join(tmpdir(), 'locco-tls-'));
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  const at = (f) => join(dir, f);
  const ssl = (...args) => execFileSync('openssl', args, { stdio: 'ignore' });
  ssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=locco-test-ca', '-keyout', at('ca.key'), '-out', at('ca.pem'));
  ssl('req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=localhost', '-keyout', at('key.pem'), '-out', at('req.csr'));
  writeFileSync(at('ext.cnf'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
  ssl('x509', '-req', '-in', at('req.csr'), '-CA', at('ca.pem'), '-CAkey', at('ca.key'), '-CAcreateserial', '-days', '1', '-out', at('cert.pem'), '-extfile', at('ext.cnf'));
  return {
    ca: readFileSync(at('ca.pem'), 'utf8'),
    cert: readFileSync(at('cert.pem'), 'utf8'),
    key: readFileSync(at('key.pem'), 'utf8'),
    certFile: at('cert.pem'),
    keyFile: at('key.pem'),
  };
}
